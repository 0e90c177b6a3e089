"""Engine fixtures: the shared tiny WeDLM checkpoint (tests/conftest.py) and one LLM per session."""

from pathlib import Path

import pytest
import torch

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"


@pytest.fixture(scope="session")
def tiny_path(tiny_wedlm):
    return tiny_wedlm


@pytest.fixture(scope="session")
def make_llm(tiny_path):
    """make_llm(**kwargs) -> LLM on the tiny checkpoint; cached per kwargs for the session."""
    from wedlm import LLM

    cache = {}

    def make(**kwargs):
        key = tuple(sorted(kwargs.items()))
        if key not in cache:
            kwargs.setdefault("kv_block_size", 4)
            kwargs.setdefault("wedlm_window_size", 4)
            kwargs.setdefault("device", "cpu")
            cache[key] = LLM(str(tiny_path), **kwargs)
        return cache[key]

    return make


@pytest.fixture
def llm(make_llm):
    return make_llm()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run far faster on one thread, above all on shared, busy cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def shipped_llm():
    """The shipped model (models/wedlm-tiny) with a window of 8 slots, one engine per test module."""
    from wedlm import LLM

    return LLM(str(SHIPPED), device="cpu", wedlm_window_size=8, kv_block_size=16)
