"""Invariant 2 (docs/invariants.md): Topological Reordering under a causal mask equals the logical-order forward
with the equivalent explicit visibility mask (docs/method.md, "Topological reordering";
docs/invariants.md, "Reordering")."""

import pytest
import torch

from wedlm.model import DenseAttention, load_model


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_reordered_causal_equals_logical_order_with_mask(ckpt_factory, family, seed):
    path = ckpt_factory(f"wedlm_{family}", family=family, wedlm=True)
    model = load_model(path)
    mask_id = model.config.mask_token_id
    gen = torch.Generator().manual_seed(seed)
    length = int(torch.randint(6, 30, (1,), generator=gen))
    tokens = torch.randint(0, 250, (length,), generator=gen)
    masked = torch.rand(length, generator=gen) < 0.5
    masked[int(torch.randint(0, length, (1,), generator=gen))] = True
    observed_pos = torch.nonzero(~masked).flatten()
    masked_pos = torch.nonzero(masked).flatten()
    order = torch.cat([observed_pos, masked_pos])  # physical slot -> logical position

    physical_ids = torch.cat([tokens[observed_pos], torch.full((len(masked_pos),), mask_id)])
    with torch.no_grad():
        reordered = model(physical_ids[None], order[None], DenseAttention())[0]

    logical_ids = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
    rank = torch.empty(length, dtype=torch.long)
    rank[order] = torch.arange(length)  # logical position -> physical slot
    visible = rank[None, :] <= rank[:, None]  # query (row) sees keys placed at or before it
    with torch.no_grad():
        logical = model(logical_ids[None], torch.arange(length)[None],
                        DenseAttention(mask=visible[None, None]))[0]

    ours = reordered[len(observed_pos):]  # rows of the mask slots, ascending position
    ref = logical[masked_pos]
    assert ours.shape == (len(masked_pos), 256)
    assert (ours - ref).abs().max().item() < 1e-4
    # and the reordering matters: plain logical-order causal attention differs
    with torch.no_grad():
        naive = model(logical_ids[None], torch.arange(length)[None], DenseAttention())[0][masked_pos]
    if observed_pos.numel() and observed_pos.max() > masked_pos.min():
        assert (naive - ref).abs().max().item() > 1e-3
