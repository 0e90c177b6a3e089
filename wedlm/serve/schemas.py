"""Request bodies of the OpenAI-compatible endpoints, as pydantic models.

The models follow OpenAI's `/v1/completions` and `/v1/chat/completions` fields and also
accept the WeDLM knobs as extra body fields (`decoding`, `wedlm_window_size`,
`wedlm_entropy_threshold`, `wedlm_pos_penalty_factor`, `wedlm_stop_by_ar`, `wedlm_stop_in_run`,
`top_k`, `stop_token_ids`, `ignore_eos`, `wedlm_trace`), which the official `openai` client sends
through `extra_body`, and the structured-output fields (`response_format`, vLLM's
`structured_outputs` / `guided_json` / `guided_regex` / `guided_choice`: `structured.py`). Unknown extra fields are tolerated, as OpenAI-compatible servers usually
do. Range checks live here so a bad request fails before it reaches the engine (the WeDLM
knobs through `check_knob`, the logit controls and logprob fields through `check_control`,
so the library and the CLI give the same message), and `param_of`
turns a pydantic error into the OpenAI error's `param` (the offending field's name).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ..engine.controls import check_control
from ..engine.defaults import DECODERS, DEFAULTS, check_knob
from .structured import FIELDS as STRUCTURED_FIELDS
from .structured import one_of, read_field

MAX_N = 16
CONTROLS = ("logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "min_tokens")
MAX_STOP_STRINGS = 4


def _numbers_only(value: Any) -> Any:
    """`value` unchanged, unless it (or an item of it, for a list) is a boolean or a string.

    Raises:
        ValueError: "must be a number, not a boolean" (or "a string").
    """
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, (bool, str)):
            raise ValueError(f"must be a number, not a {'boolean' if isinstance(item, bool) else 'string'}")
    return value


class StreamOptions(BaseModel):
    """OpenAI `stream_options`: `include_usage` adds a final chunk carrying `usage`."""

    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class SamplingFields(BaseModel):
    """Fields shared by completions and chat completions (OpenAI's plus WeDLM's knobs)."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)  # 0: only the most likely token
    top_k: int | None = Field(default=None, ge=-1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    user: str | None = None
    # WeDLM knobs (docs/method.md, "Streaming parallel decoding"): decoding strategy, window W, tau, lambda.
    decoding: str | None = None
    wedlm_window_size: int | None = None
    wedlm_entropy_threshold: float | None = None  # null: one mask per step
    wedlm_pos_penalty_factor: float | None = None
    wedlm_stop_by_ar: StrictBool | None = None  # only the AR head ends an answer (`wedlm` decoding)
    wedlm_stop_in_run: StrictBool | None = None  # with stop_by_ar: a stop closing a run filled in one forward
    ignore_eos: StrictBool = False
    # Adds a `wedlm` object (decode step index, token ids) to every streamed choice.
    wedlm_trace: StrictBool = False
    # Logit controls (OpenAI: logit_bias, presence/frequency penalties; vLLM: the rest).
    logit_bias: dict[int, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_p: float | None = None
    min_tokens: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """OpenAI's API reads null as a field not given: a null optional field whose default is not
        null (`n`, `stream`, `echo`, `ignore_eos`, ...) takes its default instead of failing its type."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if not (value is None and key in fields and not fields[key].is_required()
                        and fields[key].default is not None)}

    @field_validator("stream_options")
    @classmethod
    def _options_of_a_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):  # OpenAI's API and vLLM refuse it too
            raise ValueError("stream_options is only allowed with stream: true")
        return value

    @field_validator(*CONTROLS, mode="before")
    @classmethod
    def _control(cls, value: Any, info: ValidationInfo) -> Any:
        """The logit controls' one check (`check_control`); null leaves the control unset."""
        return None if value is None else check_control(info.field_name, value)

    # Structured outputs (serve/structured.py): each is read into a checked StructuredOutputs or None.
    response_format: Any = None
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None

    @field_validator(*STRUCTURED_FIELDS, mode="before")
    @classmethod
    def _structured(cls, value: Any, info: ValidationInfo) -> Any:
        """A bad schema or regex fails here, naming its field, before anything is queued."""
        return read_field(info.field_name, value)

    @model_validator(mode="after")
    def _one_structured(self) -> SamplingFields:
        one_of({name: getattr(self, name) for name in STRUCTURED_FIELDS})
        return self

    @field_validator(*DEFAULTS, mode="before")
    @classmethod
    def _knob(cls, value: Any, info: ValidationInfo) -> Any:
        """The WeDLM knobs' one check (`check_knob`); null leaves the knob unset."""
        return None if value is None else check_knob(info.field_name, value)

    @field_validator("max_tokens", "temperature", "top_p", "top_k", "n", "seed", "stop_token_ids", mode="before")
    @classmethod
    def _numeric(cls, value: Any) -> Any:
        """pydantic's lax mode reads `true` as 1 and `"10"` as 10; a boolean or a string where a
        number belongs is a client bug, refused as the WeDLM knobs and the controls refuse it."""
        return _numbers_only(value)

    @field_validator("decoding")
    @classmethod
    def _known_decoding(cls, value: str | None) -> str | None:
        if value is not None and value not in DECODERS:
            raise ValueError(f"must be one of {', '.join(DECODERS)}; got {value!r}")
        return value

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        return value

    def stop_list(self) -> list[str]:
        """`stop` as a list (OpenAI accepts one string or a list)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def sampling_kwargs(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for `wedlm.SamplingParams`; unset fields keep its defaults."""
        kwargs: dict[str, Any] = {"max_tokens": max_tokens}
        for name in ("temperature", "top_p", "top_k", "seed", "decoding", *DEFAULTS, "stop_token_ids", *CONTROLS):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        if "wedlm_entropy_threshold" in self.model_fields_set:
            kwargs["wedlm_entropy_threshold"] = self.wedlm_entropy_threshold  # null: one mask per step
        if self.ignore_eos:
            kwargs["ignore_eos"] = True
        if self.stop is not None:
            kwargs["stop"] = self.stop_list()
        kwargs.update(self.logprob_kwargs())
        structured = one_of({name: getattr(self, name) for name in STRUCTURED_FIELDS})
        if structured is not None:
            kwargs["structured"] = structured
        return kwargs

    def logprob_kwargs(self) -> dict[str, Any]:
        """`logprobs` / `prompt_logprobs` for `SamplingParams` (each endpoint spells them its own way)."""
        return {}

    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)


PromptType = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingFields):
    """`POST /v1/completions`: `prompt` is text, token ids, or a batch of either."""

    prompt: PromptType
    echo: StrictBool = False
    logprobs: int | None = None  # legacy: the k most likely alternatives of every token, 0..20
    suffix: str | None = None
    # OpenAI's legacy server-side ranking of best_of answers; 1 (or n) asks for none
    best_of: int | None = None

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, value: Any) -> Any:
        return check_control("logprobs", value)

    @field_validator("suffix")
    @classmethod
    def _unsupported(cls, value: Any) -> Any:
        if value:
            raise ValueError("is not supported by this server")
        return value

    @field_validator("best_of", mode="before")
    @classmethod
    def _best_of(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None and (isinstance(value, bool) or value not in (1, info.data.get("n", 1))):
            raise ValueError("best_of other than 1 or n is not supported by this server (no answer ranking); use n")
        return value

    def logprob_kwargs(self) -> dict[str, Any]:
        """`logprobs: k` gives every generated token's logprob and k alternatives; with `echo`, the prompt's too."""
        if self.logprobs is None:
            return {}
        return {"logprobs": self.logprobs, **({"prompt_logprobs": self.logprobs} if self.echo else {})}

    @field_validator("prompt")
    @classmethod
    def _non_empty_prompt(cls, value: PromptType) -> PromptType:
        if isinstance(value, list) and not value:
            raise ValueError("must not be empty")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompts of the batch, each a string or a list of token ids."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, int) for p in self.prompt):
            return [list(self.prompt)]
        return list(self.prompt)


class TextPart(BaseModel):
    """One `{"type": "text", "text": ...}` part of a message's content."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One chat turn; `content` is a string or a list of text parts. `developer` is OpenAI's
    name for `system` and is rendered as one (`wedlm.engine.chat`)."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[Any] | None = None

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: list[Any] | None) -> list[Any] | None:
        if value:  # the chat template renders content only: the calls would be dropped unseen
            raise ValueError("tool calls are not supported: this server has no tool-call parser")
        return value

    def text(self) -> str:
        """The content as one string."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: int | None = None  # alternatives per token (0..20), with `logprobs: true`
    add_generation_prompt: StrictBool = True
    tools: list[Any] | None = None
    # OpenAI's default is "auto" when tools are given; checked even when absent
    tool_choice: str | dict[str, Any] | None = Field(default=None, validate_default=True)

    @field_validator("tool_choice")
    @classmethod
    def _answers_without_tools(cls, value: Any, info: ValidationInfo) -> Any:
        if value == "none" or (value is None and not info.data.get("tools")):
            return value
        raise ValueError("this server makes no tool calls (no tool-call parser): send tool_choice \"none\" "
                         "to answer without the tools, or no tools")

    @field_validator("max_completion_tokens", mode="before")
    @classmethod
    def _numeric_max(cls, value: Any) -> Any:
        return _numbers_only(value)

    @field_validator("top_logprobs", mode="before")
    @classmethod
    def _top_logprobs(cls, value: Any) -> Any:
        return check_control("top_logprobs", value)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value

    def logprob_kwargs(self) -> dict[str, Any]:
        """`logprobs: true` gives every generated token's logprob and `top_logprobs` alternatives."""
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}

    def chat_messages(self) -> list[dict[str, str]]:
        """Messages as plain `{"role", "content"}` dicts for the chat template."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def requested_max_tokens(self) -> int | None:
        """`max_completion_tokens` (the newer name) or `max_tokens`."""
        return self.max_completion_tokens or self.max_tokens


def param_of(error: ValidationError) -> tuple[str, str]:
    """(param, message) of the first error: param is the dotted field path (`messages.0.role`)."""
    first = error.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if not _is_union_tag(part)]
    param = ".".join(loc) or "body"
    message = first.get("msg", "invalid value")
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    return param, f"Invalid value for '{param}': {message}"


def _is_union_tag(part: Any) -> bool:
    """pydantic puts union member names (`str`, `list[int]`) into error locations; drop them."""
    return isinstance(part, str) and (part in ("str", "int") or "[" in part or part.startswith("function"))
