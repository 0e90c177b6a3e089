"""Training data: pretraining JSONL (`{"text"}`) and chat SFT JSONL (`{"messages"}`) as `Document`s.

What: a text record becomes its tokens plus EOS, every token maskable and scored
(EOS is always supervised, so the model learns where a document stops). A chat
record is rendered with the tokenizer's chat template, one turn at a time:
everything up to and including each assistant header is prompt (never masked,
never scored; docs/method.md, "Training"); the assistant content and its
`<|im_end|>` are the response (masked and scored). With `learnable_ends` = N > 0
(the official trainer's `num_learnable_im_end`, default 8 there and in our
config), the last assistant reply is followed by N more `<|im_end|>` tokens, all
maskable and scored, and the conversation ends there (no template newline after
them).

Why the extra ends: a streaming decoder's window reaches past the end of an
answer, so its mask slots must learn that after the end comes the end. Without
them no training row has a mask beyond an answer, and a masked `<|im_end|>`
always sees the template's observed newline right after it, which never happens
at inference: the window then fills "," where the AR head says `<|im_end|>`.

Why turn by turn: the prompt is tokenised exactly as the engine tokenises a
request (`apply_chat_template(..., add_generation_prompt=True)`), so training
and inference see the same token boundaries.
"""

from __future__ import annotations

from pathlib import Path

from ..jsonl import read_jsonl
from .packing import Document


def text_documents(texts: list[str], tokenizer, eos_id: int) -> list[Document]:
    """Each text -> tokens + [EOS], all maskable."""
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [Document(ids + [eos_id], [True] * (len(ids) + 1)) for ids in encoded]


def chat_end_id(tokenizer) -> int | None:
    """The end token of a chat answer: `<|im_end|>`, else the tokenizer's eos id (None if neither)."""
    return tokenizer.get_vocab().get("<|im_end|>", tokenizer.eos_token_id)


def chat_document(messages: list[dict], tokenizer, end_id: int, learnable_ends: int = 0) -> Document:
    """One conversation: prompt segments unmasked, assistant replies (+ `<|im_end|>`) maskable.

    `learnable_ends` extra `<|im_end|>` tokens (maskable, scored) follow the last reply.

    Raises:
        ValueError: a conversation without an assistant message, or learnable_ends < 0.
    """
    if learnable_ends < 0:
        raise ValueError(f"learnable_ends must be >= 0, got {learnable_ends}")
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    ids: list[int] = []
    maskable: list[bool] = []
    done = 0  # messages already rendered
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prefix = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
        already = tokenizer.apply_chat_template(messages[:done], tokenize=False) if done else ""
        prompt = tokenizer(prefix[len(already):], add_special_tokens=False)["input_ids"]
        reply = tokenizer(message["content"], add_special_tokens=False)["input_ids"] + [end_id]
        if i == last and learnable_ends:
            reply += [end_id] * learnable_ends
        ids += prompt + reply
        maskable += [False] * len(prompt) + [True] * len(reply)
        done = i + 1
        if i == last and learnable_ends:
            break
        ids += tokenizer("\n", add_special_tokens=False)["input_ids"]  # template's newline after <|im_end|>
        maskable += [False] * (len(ids) - len(maskable))
    if done == 0:
        raise ValueError("conversation has no assistant message")
    return Document(ids, maskable)


def cap_sources(records: list[dict], source_limits: dict[str, int] | None) -> list[dict]:
    """Keep at most `source_limits[src]` records of each `"source"` (order kept; others untouched)."""
    if not source_limits:
        return records
    seen: dict[str, int] = {}
    out = []
    for r in records:
        src = r.get("source")
        seen[src] = seen.get(src, 0) + 1
        if src not in source_limits or seen[src] <= source_limits[src]:
            out.append(r)
    return out


def select_records(path: str | Path, limit: int | None = None, skip: int = 0,
                   source_limits: dict[str, int] | None = None) -> list[dict]:
    """The records a training stage reads: `skip` records passed over, at most `limit` after
    them (`read_jsonl`), then at most `source_limits[src]` per `"source"` (`cap_sources`).

    Raises:
        FileNotFoundError / ValueError: as `read_jsonl`.
    """
    return cap_sources(read_jsonl(path, limit, skip), source_limits)


def load_documents(path: str | Path, tokenizer, fmt: str = "auto", limit: int | None = None,
                   source_limits: dict[str, int] | None = None, learnable_ends: int = 0,
                   skip: int = 0) -> list[Document]:
    """Documents of a JSONL file; `fmt` is "text", "chat" or "auto" (from the first record).

    The records are `select_records(path, limit, skip, source_limits)` (`source_limits` is a
    curriculum knob: e.g. fewer code records in SFT); `learnable_ends` extra scored
    `<|im_end|>` tokens end each chat record (see `chat_document`).

    Raises:
        ValueError: an unknown format or a record lacking its field.
    """
    records = select_records(path, limit, skip, source_limits)
    if not records:
        raise ValueError(f"{path}: no records")
    if fmt == "auto":
        fmt = "chat" if "messages" in records[0] else "text"
    vocab = tokenizer.get_vocab()
    if fmt == "text":
        eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else vocab["<|endoftext|>"]
        return text_documents([r["text"] for r in records], tokenizer, eos)
    if fmt == "chat":
        end = chat_end_id(tokenizer)
        return [chat_document(r["messages"], tokenizer, end, learnable_ends) for r in records]
    raise ValueError(f"unknown data format {fmt!r}; expected 'text', 'chat' or 'auto'")
