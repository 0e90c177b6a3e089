"""Entry point of a tensor-parallel worker process: `python -m wedlm.engine.parallel SPEC_JSON RANK`.

Started by `launcher.py`, never by hand. Messages to rank 0 are JSON lines on
the original stdout; the process's own stdout is redirected to stderr so that
library prints cannot corrupt them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import traceback

from .worker import WorkerSpec, main, watch_parent


def entry(argv: list[str]) -> int:
    """Run rank `argv[1]` with the spec `argv[0]`; report any failure and exit 1."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def report(message: dict) -> None:
        out.write(json.dumps(message) + "\n")

    threading.Thread(target=watch_parent, daemon=True, name="wedlm-tp-watchdog").start()
    rank = int(argv[1])
    try:
        main(WorkerSpec(**json.loads(argv[0])), rank, report)
    except BaseException as err:  # noqa: BLE001 - every failure is reported, then the process exits
        try:
            report({"event": "error", "rank": rank,
                    "message": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()})
        finally:
            os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(entry(sys.argv[1:]))
