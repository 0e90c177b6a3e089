"""CLI fixtures: a tiny random WeDLM checkpoint with a ChatML byte tokenizer."""

import pytest


@pytest.fixture(scope="session")
def cli_model(ckpt_factory):
    """Folder of a tiny random WeDLM (Qwen3 style) loadable end to end."""
    return ckpt_factory("cli_tiny_wedlm", family="qwen3", wedlm=True, tokenizer=True)


@pytest.fixture(scope="session")
def cli_llm(cli_model):
    """The library engine the CLI's output is compared with."""
    from wedlm import LLM

    return LLM(model=str(cli_model), device="cpu", dtype="float32", max_model_len=256)
