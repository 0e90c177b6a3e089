"""Server fixtures over a tiny random WeDLM: a real server per test module, a reference engine.

The served engine and the reference engine the tests compare against are separate `LLM`
objects over the same checkpoint, because the server's engine thread must be the only
user of its `LLM`. Helpers live in tests_serve_util.py (conftest modules are not imported).
"""

from __future__ import annotations

import pytest
from tests_serve_util import MODEL_NAME, make_llm, running_server


@pytest.fixture(scope="session")
def reference_llm(tiny_wedlm):
    """The library engine the server's answers are compared with."""
    return make_llm(tiny_wedlm)


@pytest.fixture(scope="module")
def server(tiny_wedlm):
    """(base_url, app) of a real server over the tiny checkpoint, one per test module."""
    from wedlm.serve import create_app

    app = create_app(make_llm(tiny_wedlm, max_num_seqs=32), MODEL_NAME)
    with running_server(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def base_url(server):
    return server[0]
