"""Request intake: a prompt and its SamplingParams become a checked, ready `Sequence`.

Everything a request can get wrong is found here, before it is queued, and
raised as a `RequestError` whose `param` names the field ("prompt",
"max_tokens", "decoding", "wedlm_window_size", "request_id", "sampling_params"),
so the OpenAI server maps it to its error body without reading the message.

Context policy (one rule for the library and the server): a request must fit
the context as asked. The prompt needs at least one free position after it,
and prompt + max_tokens must not exceed max_model_len; a request that does not
fit is refused (OpenAI's behaviour), never silently shortened.
`check_fits` is that rule; the server calls it too for its up-front checks.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

from .detokenizer import IncrementalDetokenizer
from .errors import RequestError
from .request import Sequence
from .sampling_params import SamplingParams


def check_fits(prompt_len: int, max_tokens: int, max_model_len: int) -> None:
    """Refuse a request that does not fit the context.

    Args:
        prompt_len: prompt tokens.
        max_tokens: tokens the request may generate.
        max_model_len: the engine's context limit (prompt + output positions).

    Raises:
        RequestError: param "prompt" when the prompt leaves no position to generate
            into; param "max_tokens" when prompt_len + max_tokens > max_model_len.
    """
    if prompt_len + 1 > max_model_len:
        raise RequestError("prompt", f"prompt has {prompt_len} tokens; max_model_len is {max_model_len} "
                                     f"and needs at least 1 token for generation")
    if prompt_len + max_tokens > max_model_len:
        raise RequestError("max_tokens", f"max_tokens={max_tokens} does not fit: the prompt has {prompt_len} "
                                         f"tokens and max_model_len={max_model_len} leaves "
                                         f"{max_model_len - prompt_len}")


def encode_prompt(prompt: str | Iterable[int], tokenizer, vocab_size: int) -> list[int]:
    """Token ids of a prompt: a string (tokenized as given, special-token text included: the
    caller owns the whole prompt) or a sequence of ids in [0, vocab_size).

    Raises:
        RequestError (param "prompt"): no tokenizer for a string, a non-sequence, ids out
            of range or not integers (bools included), an empty prompt.
    """
    if isinstance(prompt, (bytes, bytearray)):  # iterable as ints, but its bytes are not token ids
        raise RequestError("prompt", f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    if isinstance(prompt, str):
        if tokenizer is None:
            raise RequestError("prompt", "prompt is a string but the model folder has no tokenizer; "
                                         "pass token ids")
        ids = tokenizer.encode(prompt, add_special_tokens=False)
    else:
        try:
            ids = list(prompt)
        except TypeError:
            raise RequestError("prompt", f"prompt must be a string or a list of token ids, "
                                         f"got {type(prompt).__name__}") from None
    if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) and 0 <= t < vocab_size for t in ids):
        raise RequestError("prompt", f"prompt token ids must be integers in [0, {vocab_size})")
    if not ids:
        raise RequestError("prompt", "prompt is empty; it needs at least 1 token")
    return [int(t) for t in ids]


def resolve_params(params, model_defaults: dict) -> SamplingParams:
    """The request's params with MODEL_DEFAULT fields filled from the model folder.

    Raises:
        RequestError (param "sampling_params"): not a SamplingParams.
    """
    params = SamplingParams() if params is None else params
    if not isinstance(params, SamplingParams):
        raise RequestError("sampling_params", f"sampling_params must be a SamplingParams, "
                                              f"got {type(params).__name__}")
    return params.resolve(model_defaults)


def new_sequence(request_id: str, ids: list[int], params: SamplingParams, window: int,
                 model_stop_ids: Iterable[int], tokenizer, stream: bool) -> Sequence:
    """A WAITING `Sequence` for a checked request (no generator, no decoder window yet).

    Stop ids are the request's `stop_token_ids` plus the model's unless `ignore_eos`;
    a detokenizer is attached when text is streamed or stop strings must be matched.
    """
    stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else frozenset(model_stop_ids))
    seq = Sequence(request_id=request_id, tokens=list(ids), prompt_len=len(ids), params=params,
                   max_len=len(ids) + params.max_tokens, window_size=window, stop_ids=stop_ids)
    seq.stats.prompt_tokens = len(ids)
    if tokenizer is not None and (stream or params.stop_strings):
        seq.detokenizer = IncrementalDetokenizer(tokenizer, params.stop_strings)
    return seq
