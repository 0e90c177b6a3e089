"""CLI fixtures: a tiny random WeDLM checkpoint with a ChatML byte tokenizer."""

import pytest


@pytest.fixture(scope="session")
def cli_model(tiny_wedlm):
    """Folder of the shared tiny random WeDLM (tests/conftest.py), loadable end to end."""
    return tiny_wedlm


@pytest.fixture(scope="session")
def cli_llm(cli_model):
    """The library engine the CLI's output is compared with."""
    from wedlm import LLM

    return LLM(model=str(cli_model), device="cpu", dtype="float32", max_model_len=256)
