"""docs/checkpoints.md: every `wedlm` line of its bash blocks runs on the shipped model (with its
stated exit status), except those marked `# not run by tests: <reason>`."""

import re
import shlex
from pathlib import Path

import pytest

from wedlm.cli.main import main

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "checkpoints.md"


def wedlm_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("wedlm ")]


def test_unrun_lines_give_a_reason():
    skipped = [line for line in wedlm_lines() if "# not run by tests" in line]
    assert skipped and all(re.search(r"# not run by tests: \S+", line) for line in skipped)


@pytest.mark.parametrize("line", [line for line in wedlm_lines() if "# not run by tests" not in line])
def test_documented_command_runs(line, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    command, _, comment = line.partition("#")
    argv = [a.replace("/tmp/", f"{tmp_path}/") for a in shlex.split(command)[1:]]
    expected = int(re.search(r"exits (\d)", comment).group(1)) if "exits" in comment else 0
    assert main(argv) == expected
    if expected == 2:
        assert "is a file, not a model" in capsys.readouterr().err
