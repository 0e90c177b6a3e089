"""`wedlm generate --json-schema / --json-object / --regex / --choice`: valid answers equal to the
library's; a bad schema, regex or schema file, two options at once, or a missing grammar backend
exit 2 with one line on stderr and no traceback."""

import json
import re
import sys

import pytest

from wedlm import SamplingParams
from wedlm.cli.main import main

SCHEMA = {"type": "object", "properties": {"a": {"enum": ["x", "yy"]}}, "required": ["a"],
          "additionalProperties": False}


def run_main(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as done:  # argparse's own usage errors
        code = done.code
    out, err = capsys.readouterr()
    return code, out, err


def generate(cli_model, *extra):
    return ["generate", "hi", "--model", str(cli_model), "--raw", "--temperature", "0", "--max-tokens", "24",
            "--json", *extra]


def test_json_schema_from_a_file_and_from_text(cli_model, cli_llm, capsys, tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    ref = cli_llm.generate(["hi"], SamplingParams(temperature=0, max_tokens=24, structured={"json_schema": SCHEMA}))
    for value in (str(path), json.dumps(SCHEMA)):
        code, out, err = run_main(generate(cli_model, "--json-schema", value), capsys)
        assert code == 0, err
        result = json.loads(out)
        assert result["token_ids"] == ref[0]["token_ids"] and json.loads(result["text"])["a"] in ("x", "yy")


def test_regex_and_choice(cli_model, capsys):
    code, out, err = run_main(generate(cli_model, "--regex", "[ab]{2}-[0-9]"), capsys)
    assert code == 0 and re.fullmatch("[ab]{2}-[0-9]", json.loads(out)["text"]), (out, err)
    code, out, err = run_main(generate(cli_model, "--choice", "cat", "--choice", "dog"), capsys)
    assert code == 0 and json.loads(out)["text"] in ("cat", "dog"), (out, err)


@pytest.mark.parametrize("extra,words", [
    (["--regex", "("], "error: --regex: regex is not a valid regular expression"),
    (["--json-schema", '{"type": "objec"}'], "error: --json-schema: json_schema is not a valid JSON schema"),
    (["--json-schema", "{oops"], "--json-schema"),
    (["--json-schema", "/no/such/schema.json"], "--json-schema"),
    (["--regex", "a", "--choice", "a"], "not allowed with"),
    (["--regex", "a+", "--ignore-eos"], "error: --regex: structured cannot be combined with ignore_eos"),
    (["--choice", "a", "--ignore-eos"], "error: --choice: structured cannot be combined with ignore_eos"),
])
def test_bad_structured_options_exit_2(cli_model, capsys, extra, words):
    code, out, err = run_main(generate(cli_model, *extra), capsys)
    assert code == 2 and words in err and "Traceback" not in err and not out.strip(), err


def test_missing_backend_exits_2(cli_model, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    code, out, err = run_main(generate(cli_model, "--regex", "a+"), capsys)
    assert code == 2 and "wedlm[structured]" in err and not out.strip(), err
