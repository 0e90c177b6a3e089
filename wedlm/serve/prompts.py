"""Request -> prompt token ids and `SamplingParams`, with the context checks done up front.

Prompts are tokenised on the server side (a private copy of the model's tokenizer, so
the HTTP thread never shares the engine thread's), which gives exact prompt lengths
for the context checks and for `usage`. The checks are the engine's own
(`wedlm.engine.intake.check_fits`: a prompt must leave room, prompt + max_tokens must
fit the context), run before the engine sees the request.

Chat messages go through `wedlm.engine.chat.encode_chat`: only the chat template makes
control tokens; special-token text inside a message stays plain text, `developer` is
rendered as `system`, and a message the template cannot render is a 400 naming
`messages`. A raw `/v1/completions` prompt is the caller's whole prompt and is
tokenized as given, special-token text included (docs/serving.md).

Every refusal, the server's or the engine's, is a `RequestError` whose `param` names the
field; `refusal` maps it onto the request's own field names.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from ..engine.chat import encode_chat
from ..engine.errors import RequestError
from ..engine.intake import check_fits
from .errors import APIError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from .structured import FIELDS as STRUCTURED_FIELDS

log = logging.getLogger(__name__)

DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions


def private_tokenizer(tokenizer: Any) -> Any:
    """A copy of `tokenizer` for the HTTP thread (HF fast tokenizers are not re-entrant)."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception:  # some tokenizers cannot be copied; sharing is then the only option
        log.warning("could not copy the tokenizer; sharing the engine's")
        return tokenizer


class PromptBuilder:
    """Tokenises requests and checks them against the context length.

    Args:
        tokenizer: HF tokenizer with a chat template.
        max_model_len: the engine's context length (prompt + generated tokens).
    """

    def __init__(self, tokenizer: Any, max_model_len: int):
        self.tokenizer = tokenizer
        self.max_model_len = int(max_model_len)

    # ----- prompts -----
    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        """Token ids of each prompt of a completion request (special-token text is parsed:
        the caller owns the whole prompt)."""
        out = []
        for prompt in req.prompts():
            if isinstance(prompt, str):
                if not prompt:
                    raise bad_request("prompt", "Invalid value for 'prompt': must not be empty")
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)  # as the engine does
            else:
                ids = self._checked_ids(prompt)
            out.append(self._fits(ids))
        return out

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        """Token ids of the chat template applied to the messages (generation prompt added);
        message contents can never become control tokens (`encode_chat`)."""
        return self._fits(encode_chat(self.tokenizer, req.chat_messages(), req.add_generation_prompt))

    def decode(self, ids: list[int]) -> str:
        """Text of token ids (for `echo`)."""
        return self.tokenizer.decode(ids)

    @staticmethod
    def _checked_ids(ids: list[Any]) -> list[int]:
        # The id range is the engine's to check (the model's vocabulary may exceed the tokenizer's).
        if not ids or not all(isinstance(i, int) and i >= 0 for i in ids):
            raise bad_request("prompt", "Invalid value for 'prompt': token ids must be non-negative "
                                        "integers and not empty")
        return list(ids)

    def _fits(self, ids: list[int]) -> list[int]:
        check_fits(len(ids), 1, self.max_model_len)
        return ids

    # ----- max_tokens -----
    def max_tokens(self, req: SamplingFields, prompt_len: int) -> int:
        """The request's max_tokens, checked by the engine's rule (`check_fits`).

        Unset: 16 for completions (OpenAI's default, refused as a set 16 would be where it does not
        fit: an answer is never cut shorter than asked), everything left for chat.
        """
        room = self.max_model_len - prompt_len
        chat = isinstance(req, ChatCompletionRequest)
        requested = req.requested_max_tokens() if chat else req.max_tokens
        if requested is None and chat:
            return room
        if requested is None:
            try:
                check_fits(prompt_len, DEFAULT_COMPLETION_TOKENS, self.max_model_len)
            except RequestError as err:
                if err.param != "max_tokens":
                    raise
                raise RequestError("max_tokens", f"{err} (max_tokens is unset: the default is "
                                                 f"{DEFAULT_COMPLETION_TOKENS}; set it to {room} or fewer)") from None
            return DEFAULT_COMPLETION_TOKENS
        check_fits(prompt_len, requested, self.max_model_len)
        return requested


def sampling_params(factory: Any, req: SamplingFields, max_tokens: int, choice: int = 0) -> Any:
    """`factory(**req.sampling_kwargs(max_tokens))` (factory = `wedlm.SamplingParams`).

    With a `seed`, choice j of the `n` is seeded `seed + j`: the response is reproducible
    and its choices are different samples, not n copies of one.

    Raises:
        RequestError: SamplingParams refused a value (its `param` names the field);
            a TypeError of the factory becomes one for the body.
    """
    kwargs = req.sampling_kwargs(max_tokens)
    if choice and kwargs.get("seed") is not None:
        kwargs["seed"] = kwargs["seed"] + choice
    try:
        return factory(**kwargs)
    except TypeError as err:
        raise RequestError("body", str(err)) from err


def refusal(err: ValueError, req: SamplingFields) -> APIError:
    """The 400 for a refused request: `err.param` (a `RequestError`'s; "body" for another
    ValueError) in the request's own terms: "prompt" is "messages" for chat,
    "max_tokens" is "max_completion_tokens" when the client used that name, the library's
    "structured" is the structured-output field the client sent, and "prompt_logprobs" is
    `echo` (completions ask for the prompt's logprobs with `echo` and `logprobs`)."""
    param = getattr(err, "param", None) or "body"
    if param.split(".")[0] == "structured":
        param = next((name for name in STRUCTURED_FIELDS if getattr(req, name) is not None), param)
    elif param == "prompt_logprobs":
        param = "echo"
    if isinstance(req, ChatCompletionRequest):
        if param == "prompt":
            param = "messages"
        elif param == "max_tokens" and req.max_completion_tokens is not None:
            param = "max_completion_tokens"
    return bad_request(param, f"Invalid value for '{param}': {err}")
