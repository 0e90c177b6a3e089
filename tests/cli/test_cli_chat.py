"""`wedlm chat`: scripted multi-turn session; answers equal the library's on the chat
template of the whole conversation, and each ends with tokens/forward and tok/s."""

import io

from wedlm import SamplingParams
from wedlm.cli.chat import ChatSession, repl
from wedlm.cli.main import main


def scripted(lines):
    """An `input` replacement that returns `lines`, then raises EOFError."""
    it = iter(lines)

    def read(prompt=""):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None
    return read


def library(llm, messages, max_tokens):
    text = llm.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return llm.generate([text], SamplingParams(temperature=0.0, max_tokens=max_tokens))[0]["text"]


def test_multi_turn_session_matches_library_and_prints_stats(cli_llm):
    out = io.StringIO()
    params = SamplingParams(temperature=0.0, max_tokens=6)
    session = ChatSession(cli_llm, params, out, system="Be brief.")
    assert repl(session, scripted(["Hi there", "/help", "Tell me more", "/exit", "never read"])) == 0
    roles = [m["role"] for m in session.messages()]
    assert roles == ["system", "user", "assistant", "user", "assistant"]
    history = session.messages()
    assert history[2]["content"] == library(cli_llm, history[:2], 6)
    assert history[4]["content"] == library(cli_llm, history[:4], 6)
    text = out.getvalue()
    assert text.count("tokens/forward") == 2 and text.count("tok/s") == 2 and "commands:" in text


def test_reset_system_and_colour(cli_llm):
    out = io.StringIO()
    session = ChatSession(cli_llm, SamplingParams(temperature=0.0, max_tokens=4), out, colour=True)
    repl(session, scripted(["one", "/reset", "/system You are terse.", "two"]))
    assert [m["role"] for m in session.messages()] == ["system", "user", "assistant"]
    assert session.messages()[1]["content"] == "two"
    assert "\x1b[" in out.getvalue() and "(conversation cleared)" in out.getvalue()


def test_unknown_command_is_named_and_sends_nothing(cli_llm):
    out = io.StringIO()
    session = ChatSession(cli_llm, SamplingParams(temperature=0.0, max_tokens=4), out)
    repl(session, scripted(["/rest", "/help"]))
    help_line = "commands: /reset (forget the conversation), /system TEXT (set the system message), /help, /exit"
    assert out.getvalue().splitlines() == ["wedlm chat: " + help_line, "unknown command /rest; " + help_line,
                                           help_line, ""]  # "" : the newline at end of input
    assert session.messages() == []


def test_chat_command_end_to_end(cli_model, monkeypatch, capsys):
    monkeypatch.setattr("builtins.input", scripted(["Hello", "/exit"]))
    code = main(["chat", "--model", str(cli_model), "--max-model-len", "256", "--max-tokens", "5",
                 "--temperature", "0", "--color", "never"])
    assert code == 0
    out = capsys.readouterr().out
    assert "assistant> " in out and "tokens/forward" in out and "\x1b[" not in out
