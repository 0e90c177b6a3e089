"""The request fields that ask for structured outputs, read into one `StructuredOutputs`.

OpenAI's `response_format` (`{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
{"name", "schema", "strict"}}`, `{"type": "text"}` = none) and vLLM's extra fields
`structured_outputs` (`{"json" | "regex" | "choice" | "json_object": ...}`), `guided_json`,
`guided_regex` and `guided_choice`. Each is read and its grammar checked while the body is
validated, so a bad schema or regex is a 400 naming the field before anything is queued
(`engine/structured.py` does the check; docs/serving.md, "Structured outputs").
"""

from __future__ import annotations

from typing import Any

from ..engine.structured import StructuredOutputs

FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice")
VLLM_KEYS = {"json": "json_schema", "regex": "regex", "choice": "choice", "json_object": "json_object"}


def read_field(name: str, value: Any) -> StructuredOutputs | None:
    """The constraint one field asks for (None for `response_format` `{"type": "text"}` or null).

    Raises:
        ValueError: a malformed value, a schema or regex the grammar backend refuses, or the
            backend missing; the message says which part is wrong.
    """
    if value is None:
        return None
    if name == "response_format":
        return _response_format(value)
    if name == "structured_outputs":
        return _vllm(value)
    key = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice"}[name]
    return StructuredOutputs(**{key: value})


def _response_format(value: Any) -> StructuredOutputs | None:
    if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
        raise ValueError('must be {"type": "text" | "json_object" | "json_schema", ...}')
    if value["type"] == "text":
        return None
    if value["type"] == "json_object":
        return StructuredOutputs(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), (dict, str)):
        raise ValueError('type "json_schema" needs "json_schema": {"name": ..., "schema": {...}, "strict": ...}')
    return StructuredOutputs(json_schema=spec["schema"])


def _vllm(value: Any) -> StructuredOutputs:
    if not isinstance(value, dict):
        raise ValueError(f"must be an object with one of {', '.join(VLLM_KEYS)}")
    unknown = sorted(k for k, v in value.items() if v is not None and k not in VLLM_KEYS)
    if unknown:
        raise ValueError(f"{', '.join(unknown)} is not supported; use one of {', '.join(VLLM_KEYS)}")
    return StructuredOutputs(**{VLLM_KEYS[k]: v for k, v in value.items() if v is not None})


def one_of(values: dict[str, StructuredOutputs | None]) -> StructuredOutputs | None:
    """The one constraint set among the fields.

    Raises:
        ValueError: more than one field sets a constraint.
    """
    given = [name for name, v in values.items() if v is not None]
    if len(given) > 1:
        raise ValueError(f"set at most one of {', '.join(FIELDS)}; got {', '.join(given)}")
    return values[given[0]] if given else None
