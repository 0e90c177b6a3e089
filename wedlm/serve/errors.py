"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}`.

Every failure the server reports, bad input (400, naming the field in `param` and in
the message), a missing or wrong API key (401), a refused Host (421), a body that is not
JSON (415), a busy server (429), unknown routes (404), wrong methods (405) and engine
failures (500), uses this one shape, so OpenAI clients raise their usual typed exceptions.
Messages quote client input, so lone surrogates in them are escaped before rendering.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error to answer with an OpenAI-style body.

    Args:
        message: human-readable; names the offending field for bad input.
        param: the field (`temperature`, `messages.0.role`) or None.
        status: HTTP status (400 for bad input).
        type: OpenAI error type (`invalid_request_error`, `server_error`, ...).
        code: OpenAI error code (`invalid_api_key`, ...) or None.
        headers: extra response headers (`Retry-After`, `WWW-Authenticate`).
    """

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """`{"error": {...}}` as OpenAI writes it (lone surrogates in `message` and `param`
    escaped as `\\udXXX`, since the UTF-8 response cannot carry them)."""
    return {"error": {"message": _printable(message), "type": type,
                      "param": None if param is None else _printable(param), "code": code}}


def _printable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def bad_request(param: str, message: str) -> APIError:
    """A 400 for field `param`."""
    return APIError(message, param=param)


def server_error(message: str) -> APIError:
    """A 500 (engine failure)."""
    return APIError(message, param=None, status=500, type="server_error")
