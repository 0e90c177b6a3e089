"""The structured-output options of `wedlm generate`: --json-schema, --json-object, --regex, --choice.

One of them constrains the answer (`wedlm.StructuredOutputs`, docs/serving.md "Structured
outputs"); a bad schema or regex, or the grammar backend missing, is a usage error (exit 2).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any


def add_structured_args(parser: argparse.ArgumentParser) -> None:
    """Register the mutually exclusive structured-output options."""
    group = parser.add_argument_group("structured outputs (one of; needs pip install 'wedlm[structured]')")
    one = group.add_mutually_exclusive_group()
    one.add_argument("--json-schema", default=None, metavar="FILE|JSON",
                     help="the answer is JSON valid under this schema (a file, or the schema's JSON text)")
    one.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    one.add_argument("--regex", default=None, help="the answer matches this regular expression as a whole")
    one.add_argument("--choice", action="append", default=None, metavar="TEXT",
                     help="the answer is exactly one of these strings (repeat the option for each)")


def with_structured(args: argparse.Namespace, params: Any) -> Any:
    """`params` with the constraint the options ask for (unchanged when none is given).

    Raises:
        ValueError: an unreadable schema file or bad JSON, a schema or regex the backend refuses,
            or the backend missing (the message names the option's field).
    """
    fields: dict[str, Any] = {}
    if args.json_schema is not None:
        fields["json_schema"] = read_schema(args.json_schema)
    elif args.json_object:
        fields["json_object"] = True
    elif args.regex is not None:
        fields["regex"] = args.regex
    elif args.choice:
        fields["choice"] = args.choice
    if not fields:
        return params
    flag = "--" + next(iter(fields)).replace("_", "-")
    try:
        return dataclasses.replace(params, structured=fields)
    except ValueError as err:  # the library names its own field, `structured`; the user typed the flag
        raise ValueError(f"{flag}: {err}") from None


def read_schema(value: str) -> dict:
    """--json-schema's value: JSON text when it starts with '{', else a file holding it."""
    try:
        text = value if value.lstrip().startswith("{") else Path(value).read_text()
        schema = json.loads(text)
    except OSError as err:
        raise ValueError(f"--json-schema: cannot read {value!r}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--json-schema: not valid JSON: {err}") from None
    if not isinstance(schema, dict):
        raise ValueError("--json-schema: the schema must be a JSON object")
    return schema
