"""Output assembly: a decoder's committed tokens become sequence state and `StreamDelta`s.

Commits are applied one token at a time so a stop id, a stop string (matched
on the incrementally decoded text) or the length limit cuts at exactly the
right token; the deltas carry only text that can no longer change.
"""

from __future__ import annotations

from .outputs import StreamDelta
from .request import Sequence


def commit_tokens(seq: Sequence, committed: list[int], num_valid: int) -> tuple[list[int], str | None]:
    """Append `committed` to seq.tokens up to the first stop; adopt valid cache rows.

    Args:
        committed: token ids the decoder committed, in logical order.
        num_valid: how many leading ones already have valid K/V rows (they become cached).

    Returns:
        (the ids actually appended, the finish reason "stop" | "length" | None).
    """
    added, reason = [], None
    detok = seq.detokenizer
    # stop strings are matched token by token; without them the text is decoded once per commit
    per_token = detok is not None and bool(detok.stops)
    for t in committed:
        seq.tokens.append(t)
        added.append(t)
        if t in seq.stop_ids:
            reason = "stop"
            break
        if per_token and detok.add(t) and detok.stopped:
            reason = "stop"
            break
        if len(seq.tokens) >= seq.max_len:
            reason = "length"
            break
    if detok is not None and not per_token:
        detok.extend(added[:-1] if reason == "stop" else added)  # a stop id is not text
    seq.num_cached += min(num_valid, len(added))
    if seq.grammar is not None:
        seq.grammar.advance(added)
    return added, reason


def progress_delta(seq: Sequence, new_ids: list[int]) -> StreamDelta:
    """The delta of a step that committed `new_ids` without finishing the request."""
    text = seq.detokenizer.flush() if seq.detokenizer is not None else ""
    return StreamDelta(seq.request_id, new_ids, text, False, None, seq.step_index - 1)


def final_delta(seq: Sequence, new_ids: list[int], reason: str, tokenizer) -> StreamDelta:
    """The last delta of a request ("stop" | "length" | "abort"), with its stats and error.

    The text is the rest the detokenizer held back, or (non-streamed requests) the
    whole output decoded at once, a final stop token left out.
    """
    seq.finish_reason = reason
    if seq.detokenizer is not None:
        text = seq.detokenizer.finish()
    elif tokenizer is not None:
        out = seq.output_ids
        if out and out[-1] in seq.stop_ids and reason == "stop":
            out = out[:-1]
        text = tokenizer.decode(out)
    else:
        text = ""
    step_index = seq.step_index
    seq.step_index += 1
    return StreamDelta(seq.request_id, new_ids, text, True, reason, step_index, seq.stats.to_dict(), seq.error)
