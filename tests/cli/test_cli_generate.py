"""`wedlm generate`: complete --help, --json equal to LLM.generate, prompt from file and stdin."""

import io
import json

import pytest

from wedlm import SamplingParams
from wedlm.cli.main import build_parser, main

COMMANDS = ("generate", "chat", "serve")


def sub_parser(name):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[name]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_documents_every_option(name, capsys):
    parser = sub_parser(name)
    for action in parser._actions:
        assert action.help, f"{name}: {action.option_strings or action.dest} has no help"
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("--model", "--device", "--window-size"):
        assert option in out
    if name != "serve":
        for option in ("--decoding", "--threshold", "--penalty", "--temperature", "--max-tokens"):
            assert option in out


@pytest.mark.parametrize("name", COMMANDS)
def test_window_size_help_names_where_its_default_comes_from(name, cli_model, tmp_path):
    """The engine takes W from the model's generation_config.json before its own 16."""
    import shutil

    from wedlm import LLM

    action = next(a for a in sub_parser(name)._actions if "--window-size" in a.option_strings)
    assert action.help.endswith("default: the model's generation_config.json, else 16")
    folder = tmp_path / "w8"
    shutil.copytree(cli_model, folder)
    (folder / "generation_config.json").write_text(json.dumps({"wedlm_window_size": 8}))
    assert LLM(model=str(folder), max_model_len=64, enforce_eager=True).engine.window_size == 8


def args(model, *extra):
    return ["generate", "--model", str(model), "--max-model-len", "256", "--temperature", "0", *extra]


def test_json_equals_library_generate(cli_model, cli_llm, capsys):
    assert main(args(cli_model, "Hello there", "--max-tokens", "8", "--threshold", "5", "--json")) == 0
    got = json.loads(capsys.readouterr().out)
    want = cli_llm.generate(["Hello there"], SamplingParams(temperature=0.0, max_tokens=8,
                                                             wedlm_entropy_threshold=5.0))[0]
    assert got["text"] == want["text"] and got["token_ids"] == want["token_ids"]
    assert set(got["stats"]) >= {"decode_forwards", "tokens_per_forward", "p_cache"}
    assert got["finish_reason"] == "length"


def test_prompt_from_file_and_stdin_and_streamed_text(cli_model, cli_llm, tmp_path, capsys, monkeypatch):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Count: 1 2 3")
    want = cli_llm.generate(["Count: 1 2 3"], SamplingParams(temperature=0.0, max_tokens=6, decoding="ar"))[0]
    assert main(args(cli_model, "--file", str(prompt), "--max-tokens", "6", "--decoding", "ar")) == 0
    out, err = capsys.readouterr()
    assert out == want["text"] + "\n"
    assert "tokens/forward" in err and "tok/s" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("Count: 1 2 3"))
    assert main(args(cli_model, "-", "--max-tokens", "6", "--decoding", "ar", "--json")) == 0
    assert json.loads(capsys.readouterr().out)["text"] == want["text"]


def test_chat_flag_uses_the_template(cli_model, cli_llm, capsys):
    assert main(args(cli_model, "Hi", "--chat", "--system", "Be brief.", "--max-tokens", "5", "--json")) == 0
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = cli_llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = cli_llm.generate([text], SamplingParams(temperature=0.0, max_tokens=5))[0]
    assert json.loads(capsys.readouterr().out)["token_ids"] == want["token_ids"]


@pytest.mark.parametrize("mode", [["--raw"], ["--no-chat"], []])
def test_system_without_the_chat_template_is_a_usage_error(cli_model, capsys, mode):
    """cli_model is not chat-only, so no flag means the raw prompt too."""
    assert main(args(cli_model, "Hi", "--system", "Be brief.", "--max-tokens", "2", *mode)) == 2
    err = capsys.readouterr().err
    assert "wedlm generate: error: --system needs the chat template (--chat)" in err


@pytest.mark.parametrize("extra,field", [
    (["--top-p", "2"], "top_p"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--temperature", "-1"], "temperature"),
])
def test_bad_parameters_exit_2_naming_the_field(cli_model, capsys, extra, field):
    assert main(args(cli_model, "x", *extra)) == 2
    assert field in capsys.readouterr().err


def test_missing_prompt_is_a_usage_error(cli_model, capsys):
    assert main(args(cli_model)) == 2
    assert "no prompt" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["--chat", "--raw"])
def test_empty_prompt_is_a_usage_error_naming_its_source(cli_model, capsys, monkeypatch, tmp_path, mode):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    for source, where in ((["-"], "stdin"), (["--file", str(empty)], str(empty)), ([""], "the argument")):
        assert main(args(cli_model, *source, mode)) == 2
        out, err = capsys.readouterr()
        assert out == "" and f"wedlm generate: error: prompt is empty ({where})" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_model_folder_is_a_clear_error_not_a_traceback(command, tmp_path, capsys):
    code = main([command, "--model", str(tmp_path / "nope"), *(["x"] if command == "generate" else [])])
    err = capsys.readouterr().err
    assert code == 2 and f"wedlm {command}: error:" in err and "does not exist" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("extra,field", [
    (["--window-size", "0"], "window_size"),
    (["--max-model-len", "100000"], "max_model_len"),
    (["--max-num-seqs", "0"], "max_num_seqs"),
])
def test_bad_engine_options_exit_2_naming_the_field(cli_model, capsys, extra, field):
    assert main(["generate", "--model", str(cli_model), "x", *extra]) == 2
    assert field in capsys.readouterr().err


def test_chat_flag_without_a_chat_template_is_a_usage_error(cli_model, tmp_path, capsys):
    import shutil

    folder = tmp_path / "no_template"
    shutil.copytree(cli_model, folder)
    for name in ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink(missing_ok=True)
    assert main(["generate", "--model", str(folder), "--max-model-len", "64", "x", "--chat"]) == 2
    assert "chat template" in capsys.readouterr().err


@pytest.mark.parametrize("flags, by_ar, in_run", [
    ([], None, None), (["--stop-by-ar", "--stop-in-run"], True, True), (["--no-stop-in-run"], None, False)])
def test_stop_rule_flags_reach_sampling_params(flags, by_ar, in_run):
    from wedlm.cli.options import sampling_params_from_args
    from wedlm.engine.sampling_params import MODEL_DEFAULT

    p = sampling_params_from_args(build_parser().parse_args(["generate", "--model", "m", "hi", *flags]))
    assert p.wedlm_stop_by_ar is (MODEL_DEFAULT if by_ar is None else by_ar)
    assert p.wedlm_stop_in_run is (MODEL_DEFAULT if in_run is None else in_run)


def test_readme_system_message_claim_holds_on_the_shipped_model(capsys):
    """README.md, "The shipped model": a system message it never saw breaks its arithmetic."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    assert ('`--system "Be brief."` and `--temperature 0` "What is 47 + 38?" comes out `37 + 38 = 80`'
            in (repo / "README.md").read_text())
    base = ["generate", "--model", str(repo / "models" / "wedlm-tiny"), "--chat", "--temperature", "0"]
    assert main([*base, "What is 47 + 38?"]) == 0
    assert capsys.readouterr().out == "47 + 38 = 85\n"
    assert main([*base, "--system", "Be brief.", "What is 47 + 38?"]) == 0
    assert capsys.readouterr().out == "37 + 38 = 80\n"
