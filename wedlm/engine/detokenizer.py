"""Incremental detokenisation with UTF-8 safety and stop-string holdback.

Tokens arrive one at a time (several per step under WeDLM). Text is decoded
over a short sliding range of ids so each token costs O(1) tokenizer work,
and a decode that ends in U+FFFD (an incomplete UTF-8 sequence split across
byte-level tokens) is held until the next token completes it. Emitted text
never contains any part of a stop string: the longest suffix of the text that
could still grow into a stop string is held back until it is resolved.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from transformers import PreTrainedTokenizerFast

REPLACEMENT = "\ufffd"


def text_decoder(tokenizer) -> Callable[[list[int]], str]:
    """`tokenizer.decode`, or the `tokenizers` backend's decode when that is all it does (a fast
    tokenizer whose `_decode` is the library's, without clean-up of tokenization spaces: the same
    text). Streaming decodes twice per token, and the wrapper's argument checks and conversions
    took ~4 of its ~5 us a call (shipped tokenizer, one thread)."""
    if (getattr(type(tokenizer), "_decode", None) is PreTrainedTokenizerFast._decode
            and not getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return functools.partial(tokenizer.backend_tokenizer.decode, skip_special_tokens=False)
    return tokenizer.decode


class IncrementalDetokenizer:
    """Turns a stream of output token ids into final text, stop strings applied.

    Args:
        tokenizer: a HF tokenizer (`decode`).
        stop_strings: strings that end generation; the text ends before the match.
    """

    def __init__(self, tokenizer, stop_strings: list[str] | None = None) -> None:
        self.decode = text_decoder(tokenizer)
        self.stops = list(stop_strings or [])
        self.max_stop = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.text = ""
        self.prefix_offset = 0
        self.read_offset = 0
        self.emitted = 0
        self.stopped = False

    def add(self, token_id: int) -> bool:
        """Append one token; True if a stop string now matches (text truncated before it)."""
        start = len(self.text)
        if not self._advance([token_id]):
            self.ids.append(token_id)  # an incomplete character: wait for the next token
            return False
        return self._match_stop(start)

    def extend(self, token_ids: list[int]) -> None:
        """Append several tokens at once, for a detokenizer without stop strings: the text `add`
        gives one token at a time, with two decodes for the lot instead of two per token (each
        decode covers the range since the last complete character). Where the lot ends inside a
        character, its tokens go through `add` one by one, so the complete characters before it
        are text at once, as with `add`.

        Raises:
            ValueError: this detokenizer has stop strings (they are matched token by token).
        """
        if self.stops:
            raise ValueError("extend: a detokenizer with stop strings takes one token at a time (add)")
        if len(token_ids) > 1 and self._advance(token_ids):
            return
        for t in token_ids:
            self.add(t)

    def _advance(self, new_ids: list[int]) -> bool:
        """Decode the range since the last complete character with `new_ids` appended: when it
        ends on a complete character, take the ids and the new text and return True; else change
        nothing and return False."""
        tail = self.ids[self.prefix_offset:] + new_ids
        before = self.decode(tail[:self.read_offset - self.prefix_offset])
        after = self.decode(tail)
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return False
        self.ids += new_ids
        self.text += after[len(before):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return True

    def _match_stop(self, new_start: int) -> bool:
        if not self.stops:
            return False
        search_from = max(0, new_start - self.max_stop + 1)
        hits = [i for i in (self.text.find(s, search_from) for s in self.stops) if i >= 0]
        if not hits:
            return False
        self.text = self.text[:min(hits)]
        self.stopped = True
        return True

    def flush(self) -> str:
        """Text that became final since the last call (stop-string prefixes held back)."""
        end = len(self.text) - self._holdback()
        if end <= self.emitted:
            return ""
        out = self.text[self.emitted:end]
        self.emitted = end
        return out

    def finish(self) -> str:
        """Release everything at the end of generation (pending bytes decode as U+FFFD)."""
        if not self.stopped and self.read_offset < len(self.ids):
            before = self.decode(self.ids[self.prefix_offset:self.read_offset])
            self.text += self.decode(self.ids[self.prefix_offset:])[len(before):]
            self.read_offset = len(self.ids)
        out = self.text[self.emitted:]
        self.emitted = len(self.text)
        return out

    def _holdback(self) -> int:
        """Length of the longest text suffix that is a proper prefix of a stop string."""
        if self.stopped:
            return 0
        for k in range(min(self.max_stop - 1, len(self.text)), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
