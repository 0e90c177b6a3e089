"""Structured outputs: answers valid by construction under a JSON schema, JSON mode, a regex or a choice.

The grammar backend is xgrammar (`pip install 'wedlm[structured]'`): it runs on CPU, computes a
token mask in microseconds, and its matcher can roll back the tokens it accepted, which is what
checking a filled run of a parallel-decoding window ahead of the commit needs (docs/serving.md,
"Structured outputs", says why it was chosen over llguidance and outlines-core).

Three layers, each cached:

* `StructuredOutputs`: what a request asks for (one of json_schema / json_object / regex /
  choice), checked when it is built: a bad schema or regex is a `RequestError` naming the field.
* `GrammarBackend`: one per tokenizer (and logits width): the backend's tokenizer info, its
  compiler, and an LRU of compiled grammars keyed by the constraint's text.
* `GrammarState`: one per sequence, the matcher advanced along the committed output. Decoders
  ask it for the mask of the next position after a run of window slots (`mask_logits`), check a
  filled run against it without committing (`valid_prefix`, accept then roll back), walk a
  window left to right masking each slot after the tokens decided before it (`lookahead`), and
  `commit.py` advances it along what is committed (`advance`).

A stop token is allowed exactly where the grammar may end (the matcher's stop tokens are the
request's stop ids). Special tokens other than the stop ids are never allowed: xgrammar would
otherwise read `<|im_start|>` or `<|mask|>` as literal text inside a JSON string.
"""

from __future__ import annotations

import importlib
import json
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import RequestError

INSTALL_HINT = "pip install 'wedlm[structured]' (the xgrammar package)"
GRAMMAR_CACHE_SIZE = 64
KINDS = ("json_schema", "json_object", "regex", "choice")


class BackendMissingError(RequestError):
    """Structured outputs were asked for but xgrammar is not installed."""

    def __init__(self, param: str) -> None:
        super().__init__(param, f"structured outputs need the grammar backend: {INSTALL_HINT}")


def load_backend(param: str = "structured") -> Any:
    """The `xgrammar` module.

    Raises:
        BackendMissingError (a RequestError, param `param`): xgrammar is not installed.
    """
    try:
        return importlib.import_module("xgrammar")
    except ImportError:
        raise BackendMissingError(param) from None


@dataclass(frozen=True)
class StructuredOutputs:
    """One output constraint of a request (`SamplingParams(structured=...)`); set exactly one field.

    Attributes:
        json_schema: a JSON schema (a dict or its JSON text); the answer is one JSON value it accepts.
        json_object: True = any JSON object (OpenAI's `{"type": "json_object"}`).
        regex: the answer matches this regular expression as a whole.
        choice: the answer is exactly one of these strings.

    Raises:
        RequestError (a ValueError): no field or several set (param "structured"); a schema, regex
            or choice list the backend refuses (param "structured.<field>", the message says why);
            the backend is not installed (`BackendMissingError`).
    """

    json_schema: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None

    def __post_init__(self) -> None:
        kind = self.kind
        if isinstance(self.choice, (list, tuple)):
            object.__setattr__(self, "choice", tuple(self.choice))
        _check_shape(self, kind)
        xgr = load_backend(f"structured.{kind}")
        try:
            grammar(xgr, kind, self.text)
        except (RuntimeError, ValueError) as err:
            raise RequestError(f"structured.{kind}", f"{kind} is not a valid {_WHAT[kind]}: "
                                                     f"{_first_line(err)}") from None

    @property
    def kind(self) -> str:
        """The one field set: "json_schema", "json_object", "regex" or "choice"."""
        kinds = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(kinds) != 1:
            raise RequestError("structured", f"structured needs exactly one of {', '.join(KINDS)}; "
                                             f"got {', '.join(kinds) or 'none'}")
        return kinds[0]

    @property
    def text(self) -> str:
        """The constraint as text: the cache key of its compiled grammar (with `kind`)."""
        value = getattr(self, self.kind)
        if self.kind == "json_schema":  # one text per schema, however it was spaced (key order kept:
            return json.dumps(_parsed(value), separators=(",", ":"))  # properties are generated in it)
        if self.kind == "choice":
            return json.dumps(list(value), ensure_ascii=False)
        return "" if self.kind == "json_object" else value


def _parsed(schema: dict | str) -> Any:
    """A schema given as text, parsed (the text itself when it is not JSON: the backend says why)."""
    if not isinstance(schema, str):
        return schema
    try:
        return json.loads(schema)
    except ValueError:
        return schema


_WHAT = {"json_schema": "JSON schema", "json_object": "flag", "regex": "regular expression",
         "choice": "list of choices"}


def _check_shape(s: StructuredOutputs, kind: str) -> None:
    param = f"structured.{kind}"
    if kind == "json_schema" and not isinstance(s.json_schema, (dict, str)):
        raise RequestError(param, f"{param} must be a JSON object or its text, got {type(s.json_schema).__name__}")
    if kind == "json_object" and s.json_object is not True:
        raise RequestError(param, f"{param} must be true or unset, got {s.json_object!r}")
    if kind == "regex" and not (isinstance(s.regex, str) and s.regex):
        raise RequestError(param, f"{param} must be a non-empty string, got {s.regex!r}")
    if kind == "choice" and not (isinstance(s.choice, tuple) and s.choice
                                 and all(isinstance(c, str) and c for c in s.choice)):
        raise RequestError(param, f"{param} must be a non-empty list of non-empty strings, got {s.choice!r}")


def _first_line(err: Exception) -> str:
    """The backend's message without its C++ source location prefix."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text.split(": ", 1)[1] if text.startswith("[") and ": " in text else text


def grammar(xgr: Any, kind: str, text: str) -> Any:
    """The backend's tokenizer-free `Grammar` of a constraint (checks it; no vocabulary work).

    Raises:
        RuntimeError / ValueError: the backend refuses the schema or regex.
    """
    if kind == "json_schema":
        return xgr.Grammar.from_json_schema(text, any_whitespace=False, strict_mode=True)
    if kind == "json_object":
        return xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return xgr.Grammar.from_regex(text)
    choices = json.loads(text)
    return xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))


class GrammarBackend:
    """xgrammar's tokenizer info and compiler for one tokenizer, with an LRU of compiled grammars.

    Args:
        tokenizer: a transformers tokenizer.
        vocab_size: the model's logits width V (>= the tokenizer's size; ids past it never allowed).
        never: ids never allowed in a constrained answer ([MASK], chat markers).

    Attributes:
        hits / misses: compiled-grammar cache lookups served from the cache / compiled.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, never: set[int]) -> None:
        xgr = load_backend()
        self.xgr = xgr
        detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        vocab = [""] * vocab_size
        for token, i in tokenizer.get_vocab().items():
            if i < vocab_size and i not in never:
                vocab[i] = token  # an empty entry is one xgrammar never allows
        self.info = xgr.TokenizerInfo(vocab, detected.vocab_type, vocab_size=vocab_size,
                                      stop_token_ids=detected.stop_token_ids,
                                      add_prefix_space=detected.add_prefix_space)
        self.vocab_size = vocab_size
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self._compiled: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self.hits = self.misses = 0

    def compiled(self, structured: StructuredOutputs) -> Any:
        """The compiled grammar of `structured`, from the LRU when its text was compiled before."""
        key = (structured.kind, structured.text)
        if key in self._compiled:
            self.hits += 1
            self._compiled.move_to_end(key)
            return self._compiled[key]
        self.misses += 1
        compiled = self.compiler.compile_grammar(grammar(self.xgr, *key))
        self._compiled[key] = compiled
        if len(self._compiled) > GRAMMAR_CACHE_SIZE:
            self._compiled.popitem(last=False)
        return compiled

    def state(self, structured: StructuredOutputs, stop_ids: frozenset[int]) -> GrammarState:
        """A fresh matcher for one sequence; the grammar may end only with one of `stop_ids`."""
        return GrammarState(self, self.compiled(structured), stop_ids)


_BACKENDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_for(tokenizer: Any, vocab_size: int, never: set[int]) -> GrammarBackend:
    """The `GrammarBackend` of a tokenizer, built once per (tokenizer, V) and kept while it lives."""
    per_tokenizer = _BACKENDS.setdefault(tokenizer, {})
    key = (vocab_size, frozenset(never))
    if key not in per_tokenizer:
        per_tokenizer[key] = GrammarBackend(tokenizer, vocab_size, never)
    return per_tokenizer[key]


class GrammarState:
    """One sequence's matcher, advanced along its committed output (`advance`, from `commit.py`).

    Lookahead (`mask_logits`, `valid_prefix`) accepts window tokens and rolls them back, so the
    committed state is unchanged when they return.
    """

    def __init__(self, backend: GrammarBackend, compiled: Any, stop_ids: frozenset[int]) -> None:
        xgr = backend.xgr
        self.xgr = xgr
        self.matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_ids))
        self.bitmask = xgr.allocate_token_bitmask(1, backend.vocab_size)
        self.vocab_size = backend.vocab_size

    def stuck(self) -> bool:
        """Whether the grammar allows no token at all after the committed output (no stop either):
        a grammar that accepts no string (`[^\\s\\S]`), or none this vocabulary can spell."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        return self._allows_none()

    def check_spellable(self) -> None:
        """After a `fill_next_token_bitmask`: raise when the bitmask allows no token, so a request
        whose grammar cannot go on (the text it needs spelt only by a stop token, which never
        spells grammar text) fails with this message instead of a sampler's error on a row with
        no mass.

        Raises:
            ValueError: no token allowed.
        """
        if self._allows_none():
            raise ValueError("the structured-output grammar allows no token this tokenizer can spell after "
                             "the answer so far (a stop token never spells grammar text)")

    def _allows_none(self) -> bool:
        """Whether the filled bitmask (int32 [1, ceil(V / 32)]) allows no token, stop tokens included:
        the one emptiness test behind `stuck` and `check_spellable`."""
        return not bool(self.bitmask.any())

    def advance(self, tokens: list[int]) -> None:
        """Accept committed tokens.

        Raises:
            ValueError: the grammar rejects one (a decoder let an invalid token through).
        """
        for t in tokens:
            if not self.matcher.accept_token(int(t)):
                raise ValueError(f"token {t} breaks the structured-output grammar")

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many leading `tokens` the grammar accepts after the committed output (nothing kept).

        Tokens after a stop token the grammar accepts count as accepted: the answer ends at the
        stop, so they are never committed.
        """
        accepted = 0
        for t in tokens:
            if self.matcher.is_terminated():
                break
            if not self.matcher.accept_token(int(t)):
                self._undo(accepted)
                return accepted
            accepted += 1
        self._undo(accepted)
        return len(tokens) if accepted < len(tokens) else accepted

    def _undo(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)

    def lookahead(self) -> Lookahead:
        """A `Lookahead` on this matcher: use it in a `with` block, which rolls back everything it
        accepted, so the committed state is unchanged after the block."""
        return Lookahead(self)

    def allowed(self, run: list[int]) -> Any:
        """bool [V]: the tokens the grammar allows after the committed output plus `run`
        (a run it accepts: `valid_prefix(run) == len(run)`); None when `run` holds a stop token
        (what follows is never committed, so anything goes)."""
        accepted = 0
        for t in run:
            if self.matcher.is_terminated():
                break
            self.matcher.accept_token(int(t))
            accepted += 1
        ended = self.matcher.is_terminated()
        if not ended:
            self.matcher.fill_next_token_bitmask(self.bitmask)
        self._undo(accepted)
        if ended:
            return None
        self.check_spellable()
        import torch  # here, not at the top: SamplingParams imports this module and stays torch-free

        bits = self.bitmask[0]
        shifts = torch.arange(32, dtype=torch.int32)
        return ((bits[:, None] >> shifts) & 1).bool().reshape(-1)[: self.vocab_size]

    def forced(self, run: list[int]) -> int | None:
        """The one token the grammar allows after the committed output plus `run` (a run it
        accepts), or None when it allows several, or `run` holds a stop token."""
        allowed = self.allowed(run)
        if allowed is None:
            return None
        ids = allowed.nonzero()
        return int(ids[0, 0]) if ids.shape[0] == 1 else None

    def mask_logits(self, logits: Any, run: list[int]) -> Any:
        """A copy of logits float [V] or [1, V] with every token the grammar forbids after
        the committed output plus `run` set to -inf (unchanged after a stop token in `run`)."""
        allowed = self.allowed(run)
        if allowed is None:
            return logits.clone()
        return grammar_wins(logits, lambda x: x.masked_fill(~allowed.to(x.device), float("-inf")))


class Lookahead:
    """Window tokens tried ahead of the commit on a sequence's matcher (structured outputs inside
    the window of paper section 5.2): `accept` extends the tried run one token at a time and
    `mask_row` masks a row of logits to what the grammar allows after the committed output plus
    that run. Leaving the `with` block rolls the run back (the matcher's own rollback).
    """

    def __init__(self, state: GrammarState) -> None:
        self.state = state
        self.accepted = 0

    def __enter__(self) -> Lookahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.state._undo(self.accepted)
        self.accepted = 0

    @property
    def ended(self) -> bool:
        """The run holds a stop token the grammar accepted (nothing after it is ever committed)."""
        return self.state.matcher.is_terminated()

    def accept(self, token: int) -> bool:
        """Extend the run by `token`; False, and the run unchanged, when the grammar rejects it."""
        if not self.state.matcher.accept_token(int(token)):
            return False
        self.accepted += 1
        return True

    def forced_token(self) -> int | None:
        """The first token of the text the grammar forces after the run (a JSON key, punctuation,
        the rest of a choice), in xgrammar's longest-match tokenization of that text, which
        stops before a token a longer one could extend (`find_jump_forward_tokens`); None when
        the next character is not forced, or only a stop token is."""
        tokens = self.state.matcher.find_jump_forward_tokens()
        return int(tokens[0]) if tokens else None

    def mask_row(self, logits: Any) -> Any:
        """The grammar's mask after the run applied to one row of logits: a float32 [V] copy of
        logits float [V] (any float dtype and device, left unchanged) with every token the
        grammar forbids at -inf (xgrammar's `fill_next_token_bitmask` into the sequence's one
        bitmask, then `apply_token_bitmask_inplace`), under `grammar_wins`.

        Raises:
            ValueError: the grammar allows no token after the run (`check_spellable`).
        """
        import torch  # here, not at the top: SamplingParams imports this module and stays torch-free

        state = self.state
        state.matcher.fill_next_token_bitmask(state.bitmask, 0)
        state.check_spellable()
        row = logits.detach().to(dtype=torch.float32, copy=True)[None]
        bits = state.bitmask.to(row.device, non_blocking=True)
        backend = "cpu" if row.device.type == "cpu" else "torch_native"

        def forbid(x: Any) -> Any:  # in place on x [1, V]: the bitmask spans all V
            state.xgr.apply_token_bitmask_inplace(x, bits, backend=backend)
            return x

        return grammar_wins(row, forbid)[0]


def grammar_wins(logits: Any, forbid: Callable[[Any], Any]) -> Any:
    """`forbid(logits)`: logits float [..., V] with every token the grammar forbids at -inf (`forbid`
    may work in place), or, when the request's logit controls left none of the tokens the grammar
    allows finite (min_tokens' -inf on the stop tokens where the grammar must end), `forbid` of
    zeros shaped like logits (0 at every allowed token): the grammar decides, uniformly over what
    it allows, so the answer stays valid and sampling never meets a row with no mass."""
    masked = forbid(logits)
    if bool(masked.isfinite().any()):
        return masked
    return forbid(masked.new_zeros(masked.shape))
