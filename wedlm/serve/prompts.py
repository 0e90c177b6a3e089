"""Request -> prompt token ids and `SamplingParams`, with the context checks done up front.

Prompts are tokenised on the server side (a private copy of the model's tokenizer, so
the HTTP thread never shares the engine thread's), which gives exact prompt lengths
for the context checks and for `usage`: a prompt that fills the context, or a
`max_tokens` that does not fit after the prompt, is a 400 naming the field before the
engine sees it. Chat messages go through the model's chat template (ChatML for WeDLM)
with the generation prompt appended, as the library's chat helpers do.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

from .errors import APIError, bad_request
from .schemas import ChatCompletionRequest, CompletionRequest, SamplingFields

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
        """Token ids of each prompt of a completion request."""
        out = []
        for prompt in req.prompts():
            if isinstance(prompt, str):
                if not prompt:
                    raise bad_request("prompt", "Invalid value for 'prompt': must not be empty")
                ids = self.tokenizer.encode(prompt, add_special_tokens=False)  # as the engine does
            else:
                ids = self._checked_ids(prompt)
            out.append(self._fits("prompt", ids))
        return out

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        """Token ids of the chat template applied to the messages (generation prompt added)."""
        try:
            text = self.tokenizer.apply_chat_template(
                req.chat_messages(), tokenize=False, add_generation_prompt=req.add_generation_prompt)
        except Exception as err:  # the template raising on a message it does not accept
            raise bad_request("messages", f"Invalid value for 'messages': chat template failed: {err}") from err
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self._fits("messages", ids)

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

    def _fits(self, param: str, ids: list[int]) -> list[int]:
        if len(ids) >= self.max_model_len:
            raise bad_request(param, f"Invalid value for '{param}': the prompt is {len(ids)} tokens; "
                                     f"the model's context is {self.max_model_len} tokens, which must "
                                     f"leave room for at least one generated token")
        return ids

    # ----- max_tokens -----
    def max_tokens(self, req: SamplingFields, prompt_len: int) -> int:
        """The request's max_tokens, checked against the room left after the prompt.

        Unset: 16 for completions (OpenAI's default), everything left for chat.
        """
        room = self.max_model_len - prompt_len
        chat = isinstance(req, ChatCompletionRequest)
        requested = req.requested_max_tokens() if chat else req.max_tokens
        param = "max_completion_tokens" if chat and req.max_completion_tokens else "max_tokens"
        if requested is None:
            return room if chat else min(DEFAULT_COMPLETION_TOKENS, room)
        if requested > room:
            raise bad_request(param, f"Invalid value for '{param}': {requested} tokens requested but the "
                                     f"context of {self.max_model_len} tokens leaves {room} after the "
                                     f"{prompt_len}-token prompt")
        return requested


def sampling_params(factory: Any, req: SamplingFields, max_tokens: int, choice: int = 0) -> Any:
    """`factory(**req.sampling_kwargs(max_tokens))` (factory = `wedlm.SamplingParams`).

    With a `seed`, choice j of the `n` is seeded `seed + j`: the response is reproducible
    and its choices are different samples, not n copies of one.

    Raises:
        APIError: 400 when SamplingParams refuses a value; param = the field its message names.
    """
    kwargs = req.sampling_kwargs(max_tokens)
    if choice and kwargs.get("seed") is not None:
        kwargs["seed"] = kwargs["seed"] + choice
    try:
        return factory(**kwargs)
    except (ValueError, TypeError) as err:
        raise bad_request(param_in(str(err), list(kwargs)), f"Invalid request: {err}") from err


def param_in(message: str, fields: list[str], default: str = "body") -> str:
    """The longest field name that appears in an engine error message (its `param`)."""
    named = [name for name in fields if name in message]
    if named:
        return max(named, key=len)
    if "prompt" in message or "context" in message:
        return "prompt"
    return default


def engine_refusal(err: Exception, chat: bool, fields: list[str]) -> APIError:
    """A 400 for a ValueError raised by `LLM.add_request` (e.g. a prompt over a limit)."""
    param = param_in(str(err), fields)
    if param == "prompt" and chat:
        param = "messages"
    return bad_request(param, f"Invalid value for '{param}': {err}")
