"""`wedlm serve`: the OpenAI-compatible server and web chat on uvicorn.

Loads one `LLM`, wraps it with `wedlm.serve.create_app` (one engine loop shared by all
requests through continuous batching) and serves `/v1/completions`,
`/v1/chat/completions`, `/v1/models`, `/health`, `/metrics` and the web chat at `/`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from .options import add_engine_args

EXAMPLES = """examples:
  wedlm serve --port 8000                      # the shipped model, web chat at http://127.0.0.1:8000/
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --host 0.0.0.0   # not run by tests: needs a GPU
  wedlm serve --model /path/to/WeDLM-8B-Instruct --device cuda --dtype bfloat16 --tensor-parallel-size 2   # not run by tests: needs 2 GPUs

  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "wedlm-tiny", "messages": [{"role": "user", "content": "Count from 1 to 10."}], "stream": true,
         "decoding": "wedlm", "wedlm_entropy_threshold": 0.6}'
"""


def add_parser(subparsers: Any) -> None:
    """Register `wedlm serve`."""
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server with SSE streaming and a web chat",
        description="Serve a model over an OpenAI-compatible API (/v1/completions, /v1/chat/completions, "
                    "/v1/models), with /health, Prometheus /metrics and a web chat at /. WeDLM knobs are "
                    "extra body fields: decoding, wedlm_window_size, wedlm_entropy_threshold, wedlm_pos_penalty_factor.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to bind (default: %(default)s)")
    parser.add_argument("--served-model-name", default=None, metavar="NAME",
                        help="the `model` name clients send; default: the model folder's name")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"),
                        help="uvicorn and wedlm log level (default: %(default)s)")
    add_engine_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the engine and app, then serve until interrupted."""
    import uvicorn

    from wedlm.serve import create_app

    from .options import load_llm

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    llm = load_llm(args, "serve")
    if llm is None:
        return 2
    name = args.served_model_name or Path(args.model).name
    app = create_app(llm, name)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        llm.close()  # tensor-parallel workers stop with the server
    return 0
