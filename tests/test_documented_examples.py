"""Every documented example runs on the shipped model and prints a sensible answer.

Collected: each line starting with `wedlm ` inside a ```bash block of README.md and
docs/*.md (backslash continuations joined), each ```python block there, and each example
line of every sub-command's `--help` epilog. An example that cannot run in a test ends
with `# not run by tests: <reason>` (a python block: its first line), and is skipped with
that reason. Each example is its own test, run from a scratch folder that links models/,
configs/ and recipes/ of the repository, with `wedlm` on PATH running this checkout, one
thread, and its work bounded by extra arguments (argparse keeps the last value): a token
budget for generate and chat, a few items for eval, a quick single-task run for bench, two
steps on a small curriculum for train. Checks: exit 0, no traceback, output on stdout; a
counting prompt's output lists the numbers the prompt asks for, in order (the whole range
when the answer ended on its own, a prefix of it when the budget cut it).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NOT_RUN = "# not run by tests:"
MAX_TOKENS = 400
SLOW_COMMANDS = ("bench", "train", "lm-eval")
LINKED = ("models", "configs", "recipes")


def join_continuations(lines: list[str]) -> list[str]:
    """Lines with trailing-backslash continuations joined into one."""
    out, pending = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out


def doc_examples() -> list[tuple[str, str, str]]:
    """(kind "bash" | "python", where, text) of every example in README.md and docs/*.md."""
    found = []
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text()
        for match in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            lang, body = match.group(1), match.group(2)
            line_no = text[:match.start()].count("\n") + 2
            where = f"{doc.relative_to(REPO)}:{line_no}"
            if lang == "bash":
                found += [("bash", where, line.strip()) for line in join_continuations(body.splitlines())
                          if line.strip().startswith("wedlm ")]
            elif lang == "python":
                found.append(("python", where, body))
    return found


def help_examples() -> list[tuple[str, str, str]]:
    """(kind "bash", where, line) of every `wedlm ...` line in the sub-commands' --help epilogs."""
    from wedlm.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = []
    for name, sub_parser in sub.choices.items():
        for line in join_continuations((sub_parser.epilog or "").splitlines()):
            line = line.strip()
            if line.startswith("wedlm ") or re.match(r"^[^#]*\|\s*wedlm ", line):
                found.append(("bash", f"wedlm {name} --help", line))
    return found


def not_run_reason(kind: str, text: str) -> str | None:
    """The `# not run by tests: <reason>` of an example, or None."""
    mark = text.strip().splitlines()[0] if kind == "python" else text
    if kind == "python":
        return mark.split(NOT_RUN, 1)[1].strip() if mark.startswith(NOT_RUN) else None
    return text.split(NOT_RUN, 1)[1].strip() if NOT_RUN in text else None


def command_of(line: str) -> str:
    """The sub-command of a `wedlm ...` line (after an optional `... |`)."""
    words = shlex.split(line.split("|")[-1], comments=True)
    return words[1] if len(words) > 1 else ""


EXAMPLES = doc_examples() + help_examples()


def params():
    for kind, where, text in EXAMPLES:
        reason = not_run_reason(kind, text)
        label = f"{where} {text.strip().splitlines()[0][:70]}"
        marks = []
        if reason:
            marks.append(pytest.mark.skip(reason=f"not run by tests: {reason}"))
        elif kind == "bash" and command_of(text) in SLOW_COMMANDS:
            marks.append(pytest.mark.slow)
        yield pytest.param(kind, text, id=label, marks=marks)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch folder with the repository's models/, configs/, recipes/, a prompt.txt, a small
    curriculum in data/curriculum and a `wedlm` on PATH that runs this checkout."""
    root = tmp_path_factory.mktemp("examples")
    for name in LINKED:
        (root / name).symlink_to(REPO / name)
    (root / "prompt.txt").write_text("Count from 1 to 20.")
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "wedlm"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m wedlm.cli.main "$@"\n')
    shim.chmod(0o755)
    return root


def environment(workdir: Path) -> dict:
    return {**os.environ, "PATH": f"{workdir / '.bin'}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "WEDLM_CPU_BF16": "0"}


def bounded(line: str) -> str:
    """`line` with extra arguments that bound its work (the last value of an option wins)."""
    command = command_of(line)
    body = line.split(NOT_RUN)[0].split(" #")[0].rstrip()
    extra = {
        "generate": f"--max-tokens {MAX_TOKENS}",
        "chat": f"--max-tokens {MAX_TOKENS} --color never",
        "eval": "--limit 2",
        "bench": "--quick --repeats 1 --no-plots --no-transformers --tasks counting --batch-sizes 1 "
                 "--max-tokens 32 --taus 0.4 --lambdas 0.02 --blockwise-taus 0.9",
        "train": "--set max_steps=2 --set save_every=1 --set out_dir=runs/example --set data_limit=64 "
                 "--set micro_batch=2 --set seq_len=256",
        "lm-eval": "" if " ls " in f" {body} " else "--limit 1",
    }.get(command, "")
    return f"{body} {extra}".rstrip()


def counting_ranges(text: str) -> list[list[int]]:
    """The number sequences the counting prompts in `text` ask for."""
    ranges = []
    for m in re.finditer(r"Count (down )?from (\d+) to (\d+)(?: in steps of (\d+))?", text):
        a, b, step = int(m.group(2)), int(m.group(3)), int(m.group(4) or 1)
        ranges.append(list(range(a, b - 1, -step)) if m.group(1) else list(range(a, b + 1, step)))
    return ranges


def check_counting(prompt_text: str, out: str) -> None:
    """A counting answer lists the asked-for numbers in order (a prefix when cut at the budget)."""
    for want in counting_ranges(prompt_text):
        got = [int(x) for x in re.findall(r"\d+", out)]
        assert got, f"no numbers in {out[-200:]!r}"
        assert got == want[:len(got)], f"counting went wrong: {got[:30]} vs {want[:30]}"


def run_serve(line: str, workdir: Path) -> None:
    """Start `wedlm serve ...` on a free port, wait for /health and /v1/models (with the line's
    `--api-key`, if any), stop it with Ctrl-C."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = f"{line.split(' #')[0]} --port {port} --host 127.0.0.1"
    proc = subprocess.Popen(cmd, shell=True, cwd=workdir, env=environment(workdir), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        key = re.search(r"--api-key\s+(\S+)", line)
        headers = {"Authorization": f"Bearer {key.group(1)}"} if key else {}
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", headers=headers, timeout=10).json()
        assert models["data"], models
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0].decode()
    assert "Traceback" not in out, out


@pytest.mark.parametrize("kind,text", params())
def test_documented_example(kind, text, workdir):
    env = environment(workdir)
    if kind == "python":
        done = subprocess.run([sys.executable, "-c", text], cwd=workdir, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip(), "the example printed nothing"
        return
    if command_of(text) == "serve":
        run_serve(text, workdir)
        return
    if command_of(text) == "train" and not (workdir / "data" / "curriculum" / "train.jsonl").exists():
        subprocess.run([sys.executable, "-m", "wedlm.data.curriculum", "--out", "data/curriculum",
                        "--scale", "0.002"], cwd=workdir, env=env, check=True, capture_output=True)
    stdin = "Count from 1 to 5.\n/exit\n" if command_of(text) == "chat" else None
    done = subprocess.run(bounded(text), shell=True, cwd=workdir, env=env, input=stdin, capture_output=True,
                          text=True, timeout=900, check=False)
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output[-3000:]
    if "# exits 2" in text:  # a documented mistake: a one-line error on stderr, exit status 2
        assert done.returncode == 2 and "error:" in done.stderr and not done.stdout.strip(), output[-3000:]
        return
    assert done.returncode == 0, output[-3000:]
    assert done.stdout.strip(), f"the example printed nothing on stdout; stderr: {done.stderr[-1000:]}"
    if command_of(text) in ("generate", "chat"):
        answer = done.stdout.split("assistant> ", 1)[-1].split("\n[", 1)[0] if command_of(text) == "chat" \
            else done.stdout
        check_counting(stdin or text, answer)
