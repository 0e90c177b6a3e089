"""Dual-Stream Masking: the pure batch builder of WeDLM training (paper section 4.2).

What: from one packed row of clean tokens this module builds the training input
`[memory stream x_o] ++ [prediction stream x_t]`, both carrying the tokens'
logical positions; the prediction stream is cut into blocks of B tokens, each
block masks round(gamma_k * n_maskable) of its maskable tokens (gamma_k ~ U(0, 1];
none when that rounds to 0, as in the official trainer) and is topologically reordered (observed tokens first, then [MASK]s, positions
kept; section 4.1, Eq. 5-6). It also returns the boolean visibility mask, the
per-slot loss weights 1/gamma_k (Eq. 10) and the labels of both losses.

Why a pure function: the mask is the whole method, so it is pinned by a test
against a slow reference written straight from the rules (docs/invariants.md,
invariant 7). Randomness is isolated in `draw_masks`; `build_dual_stream` is
deterministic given the draw.

Visibility rules (docs/method.md, "Training"), all restricted to one document of
the packed row (no attention crosses a document boundary):
* memory token at position p sees memory tokens at positions <= p;
* a prediction token in block k sees memory tokens at positions < start(k) and
  the prediction tokens of block k that precede it physically (itself included).
Blocks are counted per document: block k of a document covers its positions
[k*B, (k+1)*B), or [k*B - o, (k+1)*B - o) with a per-document offset o drawn by
`draw_masks(..., random_offset=True)` (our option).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .packing import PackedRow

IGNORE = -100


class MaskDraw(NamedTuple):
    """One draw of the prediction-stream corruption for a row of L tokens.

    masked: bool [L], True where the prediction stream holds [MASK].
    gamma: float32 [L], the masking ratio of the token's block (0 where the
        block has no maskable token).
    offset: int64 [L] or None: per token, its document's block offset o (equal within a
        document, 0 <= o < B): block k of the document covers positions [k*B - o, (k+1)*B - o).
        None = every offset 0, the official blocks [k*B, (k+1)*B).
    """

    masked: torch.Tensor
    gamma: torch.Tensor
    offset: torch.Tensor | None = None


class DualStreamExample(NamedTuple):
    """One training row of 2L slots (memory stream first, then prediction stream).

    input_ids: int64 [2L]; memory = clean tokens, prediction = reordered tokens with [MASK]s.
    position_ids: int64 [2L], logical (document-relative) positions for RoPE.
    attention_mask: bool [2L, 2L], True where query i may attend key j.
    loss_weights: float32 [2L], 1/gamma_k at masked prediction slots (times
        `first_mask_weight` at each block's leftmost mask), 0 elsewhere (normalised over
        the batch by their sum, Eq. 10).
    labels: int64 [2L]; memory slot: the next token of its document when that
        token is scored (AR loss), else -100; prediction slot: the clean token at
        a masked slot, else -100.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_weights: torch.Tensor
    labels: torch.Tensor


def block_ids(row: PackedRow, block_size: int, offset: torch.Tensor | None = None) -> torch.Tensor:
    """int64 [L]: a row-unique block id per token (document, (position + offset) // B), ascending.

    `offset` is `MaskDraw.offset` (None = 0). Raises ValueError for block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    local = (row.positions if offset is None else row.positions + offset) // block_size
    new_block = torch.ones_like(local, dtype=torch.bool)
    new_block[1:] = (local[1:] != local[:-1]) | (row.doc_ids[1:] != row.doc_ids[:-1])
    return new_block.long().cumsum(0) - 1


def block_offsets(row: PackedRow, block_size: int, generator: torch.Generator) -> torch.Tensor:
    """int64 [L]: one offset o ~ U{0, ..., B-1} per document of the row, repeated over its tokens.

    With it block k of a document covers positions [k*B - o, (k+1)*B - o) (the first block is
    B - o tokens long). Our option, not in the paper or the official trainer: with fixed blocks
    [k*B, (k+1)*B) two tokens that always sit at the same positions (a short answer after a
    prompt of fixed length) are either always in one block or never, and a mask in a later
    block always sees the earlier block's clean tokens. A two-digit result at positions 30-31
    with its end at 32 then never has to predict the end without seeing the digits, which is
    what streaming decoding asks when one forward fills the digits and the end slot
    (docs/training.md, "Block offsets"). With a random offset any two tokens d < B apart share
    a block with probability (B - d) / B, wherever they sit. `row.doc_ids` index the draw
    (one value per id 0..max). Raises nothing.
    """
    per_doc = torch.randint(0, block_size, (int(row.doc_ids.max()) + 1,), generator=generator)
    return per_doc[row.doc_ids]


def draw_masks(row: PackedRow, block_size: int, generator: torch.Generator,
               suffix_prob: float = 0.0, random_offset: bool = False) -> MaskDraw:
    """Per block: gamma ~ U(0, 1], then mask round(gamma * n) of its n maskable tokens.

    Which tokens: a uniformly random subset (the paper and the official trainer), or, in a
    block drawn with probability `suffix_prob` (our option, 0 = official), the LAST
    round(gamma * n) maskable tokens. A suffix is the shape streaming decoding meets at its
    leftmost mask: that slot sees its prefix and nothing to its right, while under random
    masking 17% of the masked tokens of a 32-token block see no observed token after them,
    most of them in blocks with gamma near 1 (docs/training.md, "Suffix masking"). The
    draws of `suffix_prob` come after all others, so 0 reproduces the official draw exactly.

    As in the official trainer (Tencent/WeDLM `finetune/src/masking.py`), a block whose
    round(gamma * n) is 0 masks nothing and contributes no loss. So every masked token has
    gamma * n >= 0.5 and its weight 1/gamma is at most 2n (forcing one masked token with a
    tiny gamma would give it a weight up to 1e6 and let it dominate a step). Over gamma the
    summed weights of a block, sum_i 1/gamma, estimate n with a constant bias of about
    -0.34 (exactly sum_j j ln((j+1/2)/(j-1/2)) for j < n plus n ln(n/(n-1/2)); 31.65 for
    n = 32): every token keeps the same expected weight, so the loss is unbiased up to a
    per-block scale (tests/train/test_masking.py). Tokens with `row.maskable` False (SFT prompts,
    padding) are never masked.

    With `random_offset` (our option; False = official) each document's blocks are shifted by
    an offset drawn first (`block_offsets`); the draw then goes on as above on those blocks, and
    the offsets travel in `MaskDraw.offset`. False reproduces the official draw exactly.

    Raises:
        ValueError: `suffix_prob` outside [0, 1].
    """
    if not 0.0 <= suffix_prob <= 1.0:
        raise ValueError(f"suffix_prob must be in [0, 1], got {suffix_prob}")
    offset = block_offsets(row, block_size, generator) if random_offset else None
    blocks = block_ids(row, block_size, offset)
    n_blocks = int(blocks[-1]) + 1
    gammas = 1.0 - torch.rand(n_blocks, generator=generator)  # U(0, 1]
    scores = torch.rand(len(blocks), generator=generator)
    suffix = (torch.rand(n_blocks, generator=generator) < suffix_prob if suffix_prob > 0
              else torch.zeros(n_blocks, dtype=torch.bool))
    masked = torch.zeros(len(blocks), dtype=torch.bool)
    gamma = torch.zeros(len(blocks), dtype=torch.float32)
    for b in range(n_blocks):
        idx = torch.nonzero((blocks == b) & row.maskable).flatten()
        if len(idx) == 0:
            continue
        gamma[blocks == b] = gammas[b]
        k = int(float(gammas[b]) * len(idx) + 0.5)  # round half up
        if k == 0:
            continue
        chosen = idx[-k:] if suffix[b] else idx[torch.argsort(scores[idx])[:k]]
        masked[chosen] = True
    return MaskDraw(masked, gamma, offset)


def reorder_blocks(blocks: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """int64 [L] permutation: per block, observed tokens then masked ones, each ascending.

    Topological Reordering, section 4.1 (Eq. 5-6). Blocks must be ascending.
    """
    key = blocks * 2 + masked.long()  # observed (0) before masked (1) inside a block
    return torch.sort(key, stable=True).indices


def first_masked(blocks: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """bool [L]: the leftmost masked token of each block (logical order).

    Every token before it in its block is observed, so it predicts its token from a clean
    prefix: the case streaming decoding meets at window slot 0 (distance 0). In a block with
    suffix masking (`draw_masks`) nothing to its right is observed either, exactly as at
    inference with an empty window; under random masking it also sees the block's observed
    tokens to its right (physically before it after the reorder).
    `blocks` (int64 [L], ascending) and `masked` (bool [L]) as in `draw_masks`. Used by the
    `first_mask_weight` option of `build_dual_stream` (ours, not in the paper). Raises nothing.
    """
    out = torch.zeros_like(masked)
    idx = torch.nonzero(masked).flatten()
    if len(idx):
        b = blocks[idx]
        new = torch.ones_like(b, dtype=torch.bool)
        new[1:] = b[1:] != b[:-1]
        out[idx[new]] = True
    return out


def build_dual_stream(row: PackedRow, draw: MaskDraw, block_size: int, mask_token_id: int,
                      first_mask_weight: float = 1.0) -> DualStreamExample:
    """The dual-stream training row (section 4.2) for one packed row and one mask draw.

    Args:
        row: L clean tokens with document ids, positions and the scored/maskable flags.
        draw: which prediction tokens are masked, their block's gamma and the block offsets.
        block_size: B, the prediction-stream block length.
        mask_token_id: id of the [MASK] token.
        first_mask_weight: factor on the 1/gamma weight of each block's leftmost masked token
            (`first_masked`, the distance-0 prediction of streaming decoding); 1.0 = the paper.
            Our option, not in the paper or the official trainer (docs/training.md). It enters
            `loss_weights`, so the mask loss's normaliser (their sum) grows with it: the loss
            is a weighted mean in which those tokens count w times, not a larger loss.

    Returns:
        A `DualStreamExample` of 2L slots; see its fields.
    """
    L = len(row.tokens)
    blocks = block_ids(row, block_size, draw.offset)
    perm = reorder_blocks(blocks, draw.masked)  # prediction slot i holds token perm[i]
    pred_tokens = torch.where(draw.masked, torch.full_like(row.tokens, mask_token_id), row.tokens)[perm]
    input_ids = torch.cat([row.tokens, pred_tokens])
    position_ids = torch.cat([row.positions, row.positions[perm]])

    same_doc = row.doc_ids[:, None] == row.doc_ids[None, :]  # [L, L]
    causal = row.positions[:, None] >= row.positions[None, :]
    mem_mem = same_doc & causal
    offset = 0 if draw.offset is None else draw.offset
    start = ((row.positions + offset) // block_size) * block_size - offset  # block start, per token
    pred_mem = same_doc & (row.positions[None, :] < start[:, None])  # indexed by logical token
    pred_mem = pred_mem[perm]  # rows in physical prediction order
    pb = blocks[perm]
    phys = torch.arange(L)
    pred_pred = (pb[:, None] == pb[None, :]) & (phys[:, None] >= phys[None, :])
    attention_mask = torch.cat([
        torch.cat([mem_mem, torch.zeros(L, L, dtype=torch.bool)], dim=1),
        torch.cat([pred_mem, pred_pred], dim=1),
    ])

    weights = torch.where(draw.masked, 1.0 / draw.gamma.clamp_min(1e-6), torch.zeros(L))
    if first_mask_weight != 1.0:
        weights = torch.where(first_masked(blocks, draw.masked), weights * first_mask_weight, weights)
    weights_pred = weights[perm]
    loss_weights = torch.cat([torch.zeros(L), weights_pred]).float()
    labels = torch.cat([ar_labels(row), torch.where(draw.masked, row.tokens, IGNORE)[perm]])
    return DualStreamExample(input_ids, position_ids, attention_mask, loss_weights, labels)


def ar_labels(row: PackedRow) -> torch.Tensor:
    """int64 [L]: next token of the same document where that token is scored, else -100."""
    labels = torch.full_like(row.tokens, IGNORE)
    nxt_ok = (row.doc_ids[1:] == row.doc_ids[:-1]) & row.maskable[1:]
    labels[:-1] = torch.where(nxt_ok, row.tokens[1:], IGNORE)
    return labels


def build_causal(row: PackedRow) -> DualStreamExample:
    """The plain AR training row: document-causal mask, next-token labels, no prediction stream."""
    same_doc = row.doc_ids[:, None] == row.doc_ids[None, :]
    causal = row.positions[:, None] >= row.positions[None, :]
    return DualStreamExample(row.tokens.clone(), row.positions.clone(), same_doc & causal,
                             torch.zeros(len(row.tokens)), ar_labels(row))


def collate(examples: list[DualStreamExample]) -> DualStreamExample:
    """Stack rows: ids/positions/weights/labels [N, S], attention_mask [N, 1, S, S]."""
    return DualStreamExample(
        torch.stack([e.input_ids for e in examples]),
        torch.stack([e.position_ids for e in examples]),
        torch.stack([e.attention_mask for e in examples])[:, None],
        torch.stack([e.loss_weights for e in examples]),
        torch.stack([e.labels for e in examples]),
    )
