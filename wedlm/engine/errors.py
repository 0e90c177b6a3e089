"""The one error type for a request the engine refuses.

`RequestError` is a `ValueError` (so `except ValueError` keeps working) that also
names the offending request field in `param` ("temperature", "max_tokens",
"prompt", ...). `SamplingParams` and `Engine.add_request` raise it; the OpenAI
server turns `param` into its error body's `param` instead of guessing the field
from the message text.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A refused request.

    Args:
        param: the request field at fault, as `SamplingParams` / `add_request` name it.
        message: what is wrong, naming the field and its limit.
    """

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
