"""`wedlm lm-eval` without the eval extra: a clear message naming what to install."""

import sys

import pytest

from wedlm.cli.main import build_parser, main


def test_every_argument_goes_to_the_harness():
    args = build_parser().parse_args(["lm-eval", "--model", "wedlm", "--help", "-h", "--tasks", "a,b"])
    assert args.harness_args == ["--model", "wedlm", "--help", "-h", "--tasks", "a,b"]


def test_missing_lm_eval_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval.__main__", None)  # import fails as when it is not installed
    with pytest.raises(SystemExit, match=r"pip install -e \.\[eval\]"):
        main(["lm-eval", "--model", "wedlm", "--tasks", "x"])
