"""JSON Lines reading shared by training data, perplexity and the JSONL evaluation tasks."""

from __future__ import annotations

import json
from pathlib import Path


def read_jsonl(path: str | Path, limit: int | None = None, skip: int = 0) -> list[dict]:
    """Parsed records of a JSONL file, blank lines skipped: at most `limit` records after the
    first `skip` (a continued training stage reads records an earlier stage never saw).

    Returns:
        list of dicts, in file order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not JSON, or JSON that is not an object (the message names
            file and line).
    """
    records: list[dict] = []
    if limit is not None and limit <= 0:
        return records
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            if skip > 0:
                skip -= 1
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: invalid JSON ({err})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object, got {type(record).__name__}")
            records.append(record)
            if limit is not None and len(records) >= limit:
                break
    return records
