"""--enforce-eager / --no-enforce-eager and --autocast / --no-autocast reach `LLM` (generate, chat, serve)."""

import pytest

import wedlm
from wedlm.cli.main import build_parser
from wedlm.cli.options import build_llm


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
@pytest.mark.parametrize("flags,expected", [
    ([], {}),
    (["--no-enforce-eager"], {"enforce_eager": False}),
    (["--enforce-eager", "--autocast"], {"enforce_eager": True, "autocast": True}),
    (["--no-autocast"], {"autocast": False}),
])
def test_speed_flags_reach_llm(monkeypatch, command, flags, expected):
    if command in ("generate", "chat") and "--no-enforce-eager" not in flags:
        expected = {"enforce_eager": True, **expected}  # one answer: eager unless asked to compile
    seen = {}
    monkeypatch.setattr(wedlm, "LLM", lambda **kw: seen.update(kw))
    extra = ["x"] if command == "generate" else []
    build_llm(build_parser().parse_args([command, "--model", "m", *flags, *extra]))
    assert {k: seen[k] for k in ("enforce_eager", "autocast") if k in seen} == expected
