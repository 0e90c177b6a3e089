"""OpenAI-compatible HTTP serving of a WeDLM `LLM`, with a web chat at `/`.

`create_app(llm, model_name)` builds the FastAPI app; one `EngineLoop` thread owns the
(not thread-safe) `LLM` and runs its continuous-batching step loop, so every HTTP
request shares one engine. `wedlm serve` wires this to uvicorn.
"""

from .app import create_app
from .engine_loop import EngineLoop

__all__ = ["EngineLoop", "create_app"]
