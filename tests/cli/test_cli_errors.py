"""No traceback for a user mistake: every sub-command with bad arguments exits 2 with the
message on stderr; Ctrl-C stops a streamed chat answer (its KV blocks freed) and `wedlm
generate` (exit 130); a cut answer says so on stderr."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from wedlm import SamplingParams
from wedlm.cli.chat import ChatSession, repl
from wedlm.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def run_main(argv, capsys):
    """(exit status, stdout + stderr) of `wedlm ARGV` in this process."""
    try:
        code = main(argv)
    except SystemExit as done:  # argparse's own usage errors
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


BAD = [
    ["generate", "x", "--device", "cuda:7"],
    ["generate", "x", "--max-tokens", "-3"],
    ["generate", "x", "--top-k", "nan"],
    ["generate", "--file", "/no/such/prompt.txt"],
    ["generate", "x", "--model", "/no/such/model"],
    ["chat", "--device", "nosuchdevice"],
    ["chat", "--temperature", "-1"],
    ["serve", "--model", "/no/such/model"],
    ["serve", "--port", "eighty"],
    ["serve", "--api-key", " "],
    ["serve", "--public-paths", "health"],
    ["serve", "--allowed-hosts", "a b"],
    ["serve", "--allowed-hosts", ""],
    ["serve", "--max-queued-seqs", "0"],
    ["serve", "--max-seqs-per-request", "many"],
    ["bench", "--tasks", "nosuch"],
    ["bench", "--device", "cuda:7"],
    ["bench", "--repeats", "0"],
    ["bench", "--taus", "-1"],
    ["bench", "--model", "/no/such/model", "--out-dir", "{tmp}"],
    ["eval", "--tasks", "nosuch"],
    ["eval", "--limit", "0"],
    ["eval", "--limit", "count=x"],
    ["eval", "--decoding", "fast"],
    ["eval", "--device", "cuda:7"],
    ["eval", "--tasks", "gsm8k"],
    ["eval", "--model", "/no/such/model"],
    ["train", "--config", "/no/such.yaml"],
    ["train", "--config", "configs/tiny_wedlm.yaml", "--set", "data={tmp}/nope/train.jsonl"],
    ["train", "--config", "configs/tiny_wedlm.yaml", "--set", "lr=abc"],
    ["train", "--config", "configs/tiny_wedlm.yaml", "--set", "nokey"],
    ["convert", "/no/such/folder", "{tmp}/out"],
    ["nosuchcommand"],
    [],
]


def test_version_prints_the_package_version(capsys):
    import re

    version = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    code, out, err = run_main(["--version"], capsys)
    assert (code, out, err) == (0, f"wedlm {version}\n", "")


@pytest.mark.parametrize("argv, words", [
    (["eval", "--tasks", "count", "--limit", "1", "--out", "{tmp}"], "--out {tmp}: is a folder; expected a file name"),
    (["eval", "--tasks", "count", "--limit", "1", "--out", "{tmp}/afile/x.json"],
     "--out {tmp}/afile/x.json: {tmp}/afile is a file, so no folder can be made there"),
    (["bench", "--quick", "--out-dir", "{tmp}/afile"], "--out-dir {tmp}/afile: is a file; expected a folder"),
    (["bench", "--quick", "--out-dir", "{tmp}/afile/deeper"],
     "--out-dir {tmp}/afile/deeper: {tmp}/afile is a file, so no folder can be made there"),
    # a folder that cannot be made (/proc takes none, even from root)
    pytest.param(["bench", "--quick", "--out-dir", "/proc/wedlm-out"],
                 "--out-dir /proc/wedlm-out: cannot write there (No such file or directory)",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")),
    pytest.param(["eval", "--tasks", "count", "--out", "/proc/wedlm-out/r.json"],
                 "--out /proc/wedlm-out/r.json: cannot write there (No such file or directory)",
                 marks=pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc (Linux)")),
])
def test_unwritable_output_exits_2_before_the_run(argv, words, capsys, tmp_path, monkeypatch):
    """The results of a long run must not be lost to a traceback at the end."""
    def no_run(*args, **kwargs):
        raise AssertionError("the run started before its output path was checked")

    monkeypatch.setattr("wedlm.evaluate.runner.evaluate", no_run)
    monkeypatch.setattr("wedlm.bench.runner.run_bench", no_run)
    (tmp_path / "afile").write_text("not a folder")
    code, out, err = run_main([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert f"wedlm {argv[0]}: error: " + words.replace("{tmp}", str(tmp_path)) in err


@pytest.mark.parametrize("target, why", [("/no/such/prompt.txt", "No such file or directory"),
                                         ("{tmp}", "Is a directory"), ("{tmp}/latin1.txt", "not UTF-8")])
def test_an_unreadable_prompt_file_is_named(target, why, capsys, tmp_path):
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\xff")
    target = target.replace("{tmp}", str(tmp_path))
    code, out, err = run_main(["generate", "--file", target], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert f"wedlm generate: error: --file {target}: cannot read it as text ({why}" in err


def test_serve_on_a_taken_port_exits_2_before_loading_the_model(capsys, monkeypatch):
    import socket

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the port was checked")

    monkeypatch.setattr("wedlm.cli.options.load_llm", no_load)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = run_main(["serve", "--port", str(port)], capsys)
    assert code == 2 and not out
    assert f"wedlm serve: error: --port {port}: cannot bind 127.0.0.1:{port}: Address already in use" in err


@pytest.mark.parametrize("eager", [False, True])
def test_serve_compiles_the_forward_before_it_opens_its_port(eager, capsys, monkeypatch):
    """A compiled engine's graphs are built by `LLM.warm_up` before uvicorn starts, so no first
    request waits on a compile that stalls every request in the engine's loop; an eager one starts
    at once."""
    import socket
    from types import SimpleNamespace

    import uvicorn

    calls = []
    llm = SimpleNamespace(engine=SimpleNamespace(enforce_eager=eager), warm_up=lambda: calls.append("warm_up"),
                          close=lambda: calls.append("close"))
    monkeypatch.setattr("wedlm.cli.options.load_llm", lambda *args: llm)
    monkeypatch.setattr("wedlm.serve.create_app", lambda *args, **kwargs: "app")
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: calls.append(("run", app)))
    with socket.socket() as probe:  # a free port: the bind check runs before the model loads
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, _, err = run_main(["serve", "--port", str(port)], capsys)
    assert code == 0, err
    assert calls == ([] if eager else ["warm_up"]) + [("run", "app"), "close"]


@pytest.mark.parametrize("port, why", [("70000", "must be <= 65535, got 70000"), ("-1", "must be >= 1, got -1"),
                                       ("0", "must be >= 1, got 0")])
def test_serve_port_outside_tcp_range_exits_2_before_loading(port, why, capsys):
    """Parsed alone: with a port out of range `wedlm serve` would otherwise load the model and bind
    something else (70000 wraps) or fail in uvicorn with its own status."""
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["serve", "--port", port])
    assert done.value.code == 2
    assert f"wedlm serve: error: argument --port: {why}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", BAD, ids=lambda a: " ".join(a) or "(none)")
def test_bad_arguments_exit_2_without_traceback(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run_main(argv, capsys)
    assert code == 2, (argv, out, err)
    assert "Traceback" not in out + err
    assert err.strip() and "error" in err or not argv, err  # the message is on stderr
    assert "error" not in out


def test_messages_name_the_mistake(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    _, _, err = run_main(["generate", "x", "--device", "cuda:7"], capsys)
    assert "'cuda:7' is not available" in err and "available: cpu" in err
    _, _, err = run_main(["bench", "--tasks", "nosuch"], capsys)
    assert "counting, arithmetic, listops, code, text" in err
    _, _, err = run_main(["train", "--config", "configs/tiny_wedlm.yaml", "--set",
                          f"data={tmp_path}/cur/train.jsonl"], capsys)
    assert f"python -m wedlm.data.curriculum --out {tmp_path}/cur" in err
    _, out, err = run_main(["convert", "/no/such/folder", str(tmp_path / "o")], capsys)
    assert "/no/such/folder: checkpoint folder does not exist" in err and not out


@pytest.mark.parametrize("setting, why", [
    ("data={tmp}/notes.txt", "data: {tmp}/notes.txt:1: invalid JSON"),
    ("data={tmp}", "data: {tmp} is not a file"),
    ("tokenizer={tmp}", "tokenizer: {tmp} is not a folder with tokenizer files"),
    ("out_dir={tmp}/notes.txt", "out_dir: {tmp}/notes.txt: is a file; expected a folder"),
])
def test_train_refuses_bad_inputs_and_outputs_before_it_starts(setting, why, capsys, tmp_path, monkeypatch):
    """Each would have stopped the stage with a traceback after the model was built."""
    monkeypatch.chdir(REPO)
    (tmp_path / "notes.txt").write_text("not json\n")
    (tmp_path / "data.jsonl").write_text('{"text": "1, 2, 3"}\n')
    good = [f"data={tmp_path}/data.jsonl", "tokenizer=models/wedlm-tiny", f"out_dir={tmp_path}/run"]
    key = setting.split("=")[0]
    sets = [a for a in good if not a.startswith(key + "=")] + [setting.replace("{tmp}", str(tmp_path))]
    code, out, err = run_main(["train", "--config", "configs/quickstart.yaml"]
                              + [x for a in sets for x in ("--set", a)], capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert why.replace("{tmp}", str(tmp_path)) in err


@pytest.mark.parametrize("argv, why", [
    (["--quantization", "int8", "--dtype", "float16"], "quantization='int8' quantizes float32 weights, got dtype='float16'"),
    (["--quantization", "bf16", "--autocast"], "quantization='bf16' runs in one process without autocast"),
    (["--peer", "llama.cpp", "--dtype", "bfloat16"], "--peer llama.cpp runs float32 weights"),
])
def test_bench_refuses_engine_options_that_cannot_go_together(argv, why, capsys, tmp_path):
    code, out, err = run_main(["bench", "--quick", "--out-dir", str(tmp_path / "b")] + argv, capsys)
    assert code == 2 and not out and "Traceback" not in err
    assert f"wedlm bench: error: {why}" in err


def test_ctrl_c_stops_a_streamed_chat_answer_and_frees_its_blocks(cli_llm):
    free = cli_llm.metrics()["kv_blocks_free"]

    class InterruptAfterFirstWrite(io.StringIO):
        armed = False

        def write(self, text):
            n = super().write(text)
            if self.armed and text:
                self.armed = False
                os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C mid-answer
            return n

    out, err = InterruptAfterFirstWrite(), io.StringIO()
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    session = ChatSession(cli_llm, params, out, err=err)
    session.answer("first question")  # a whole answer: kept
    assert [m["role"] for m in session.messages()] == ["user", "assistant"]
    out.armed = True
    text = session.answer("second question")
    assert "[interrupted" in err.getvalue() and len(text) < 60
    assert [m["content"] for m in session.messages()][0] == "first question"
    assert len(session.messages()) == 2  # the interrupted turn is dropped, the conversation kept
    assert cli_llm.metrics()["kv_blocks_free"] == free and not cli_llm.has_unfinished()
    again = session.answer("third question")  # the prompt is back and the engine still answers
    assert len(session.messages()) == 4 and again


def test_ctrl_c_or_eof_at_the_prompt_ends_the_chat(cli_llm):
    def ctrl_c(prompt=""):
        raise KeyboardInterrupt

    session = ChatSession(cli_llm, SamplingParams(max_tokens=2), io.StringIO())
    assert repl(session, ctrl_c) == 0


def test_cut_answer_is_marked_on_stderr(cli_model, capsys):
    assert main(["generate", "--model", str(cli_model), "--max-model-len", "256", "hello", "--max-tokens", "5",
                 "--ignore-eos", "--temperature", "0"]) == 0
    assert "[stopped: max tokens 5]" in capsys.readouterr().err
    err = io.StringIO()
    session = ChatSession(None, SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0), io.StringIO(),
                          err=err)
    from wedlm import LLM

    session.llm = LLM(model=str(cli_model), max_model_len=256)
    session.answer("hi")
    assert err.getvalue() == "[stopped: max tokens 5]\n"


def model_copy(tmp_path, **fields):
    """The shipped model with extra generation_config.json fields."""
    folder = tmp_path / "wedlm-tiny"
    shutil.copytree(REPO / "models" / "wedlm-tiny", folder)
    config = folder / "generation_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **fields}))
    return folder


def test_single_turn_model_starts_each_turn_fresh(tmp_path, capsys, monkeypatch):
    folder = model_copy(tmp_path, wedlm_single_turn=True)
    lines = iter(["Count from 1 to 5.", "What is 12 + 30?"])

    def read(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr("builtins.input", read)
    assert main(["chat", "--model", str(folder), "--temperature", "0", "--color", "never"]) == 0
    out = capsys.readouterr().out
    assert out.count("every message starts a fresh conversation") == 1
    assert "1, 2, 3, 4, 5\n" in out and "12 + 30 = 42\n" in out  # the second turn is answered alone


def test_chat_only_model_gets_the_template_in_generate(tmp_path, capsys):
    folder = model_copy(tmp_path, wedlm_chat_only=True)
    assert main(["generate", "--model", str(folder), "Count from 3 to 9.", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == "3, 4, 5, 6, 7, 8, 9\n"
    assert main(["generate", "--model", str(folder), "Count from 3 to 9.", "--temperature", "0", "--raw"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == "" and "add --chat" in err  # the shipped model says nothing to a raw prompt


@pytest.mark.parametrize("value,key", [("\"yes\"", "wedlm_single_turn"), ("0", "max_new_tokens")])
def test_bad_prompting_fields_are_named(tmp_path, capsys, value, key):
    folder = model_copy(tmp_path, **{key: json.loads(value)})
    code, _, err = run_main(["generate", "--model", str(folder), "x"], capsys)
    assert code == 2 and key in err and "generation_config.json" in err


def test_default_budget_is_the_model_max_new_tokens(tmp_path):
    from wedlm.cli.main import build_parser
    from wedlm.cli.options import DEFAULT_MAX_TOKENS, sampling_params_from_args

    folder = model_copy(tmp_path, max_new_tokens=77)
    args = build_parser().parse_args(["generate", "--model", str(folder), "x"])
    assert sampling_params_from_args(args).max_tokens == 77
    args = build_parser().parse_args(["chat", "--model", str(tmp_path / "none")])
    assert sampling_params_from_args(args).max_tokens == DEFAULT_MAX_TOKENS >= 1024


def default_sigint():
    """Ctrl-C as a terminal delivers it: Python ignores SIGINT for good when it starts with
    SIGINT ignored, and the test process may have inherited or been left with that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_stdout_reader_going_away_exits_141_without_traceback():
    """`wedlm generate ... | head -c 1`: the answer keeps streaming into a closed pipe."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wedlm.cli.main", "generate", "--chat", "Count from 1 to 200.",
                             "--decoding", "ar", "--temperature", "0", "--max-tokens", "1000"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(1) == b"1"  # the answer is streaming
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err


def test_ctrl_c_during_generate_exits_130_without_traceback():
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "wedlm.cli.main", "generate", "--chat", "Count from 1 to 200.",
                             "--decoding", "ar", "--ignore-eos", "--max-tokens", "1500"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=default_sigint)
    first = proc.stdout.read(1)  # the answer is streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert first and proc.returncode == 130, err.decode()
    assert b"Traceback" not in out + err and b"interrupted" in err


@pytest.mark.parametrize("text, words", [("{bad", "invalid JSON (Expecting property name"),
                                         ("[1]", "expected a JSON object, got list"),
                                         ('{"wedlm_window_size": -3}', "wedlm_window_size must be an integer >= 1")])
@pytest.mark.parametrize("command", [["generate", "x"], ["chat"], ["serve"], ["eval", "--tasks", "count"],
                                     ["bench", "--quick"]])
def test_broken_generation_config_exits_2_naming_the_file(tmp_path, capsys, monkeypatch, text, words, command):
    def no_run(*args, **kwargs):
        raise AssertionError("the run started with a broken generation_config.json")

    monkeypatch.setattr("wedlm.evaluate.runner.evaluate", no_run)
    monkeypatch.setattr("wedlm.bench.runner.run_bench", no_run)
    folder = model_copy(tmp_path)
    (folder / "generation_config.json").write_text(text)
    extra = ["--out-dir", str(tmp_path / "bench")] if command[0] == "bench" else []
    code, out, err = run_main([*command, "--model", str(folder), *extra], capsys)
    assert code == 2 and "Traceback" not in err
    assert f"wedlm {command[0]}: error: {folder / 'generation_config.json'}: {words}" in err
