"""Fast attention paths give the dense-mask reference's logits
(docs/invariants.md, "Fast paths agree with their reference").

The chunked SDPA path (CPU default) and the FlexAttention path (GPU fast path,
unfused on CPU) are compared with `DenseAttention` on the dual-stream mask.
"""

import random

import pytest
import torch

from wedlm.model import DenseAttention, ModelConfig, QwenForCausalLM
from wedlm.train.attention import ChunkedDualStreamAttention
from wedlm.train.masking import build_causal, build_dual_stream, collate, draw_masks
from wedlm.train.packing import Document, Packer

CFG = dict(model_type="wedlm", vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=2, head_dim=8, mask_token_id=1)


def _batch(seq_len, block, dual=True, seed=0, random_offset=False):
    rng = random.Random(seed)
    docs = [Document([rng.randint(4, 127) for _ in range(n)], [True] * n)
            for n in [rng.randint(3, 2 * seq_len) for _ in range(10)]]
    packer = Packer(docs, seq_len, 0, seed)
    rows = [packer.row(i) for i in range(2)]
    if not dual:
        return collate([build_causal(r) for r in rows])
    g = torch.Generator().manual_seed(seed)
    return collate([build_dual_stream(r, draw_masks(r, block, g, 0.5 if random_offset else 0.0, random_offset), block, 1)
                    for r in rows])


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return QwenForCausalLM(ModelConfig(**CFG)).eval()


@pytest.mark.parametrize("seq_len,block,chunk,dual,offset", [(40, 4, 16, True, False), (64, 8, 24, True, False),
                                                              (33, 5, 7, True, False), (48, 8, 16, False, False),
                                                              (64, 8, 24, True, True), (33, 5, 7, True, True)])
def test_chunked_equals_dense(model, seq_len, block, chunk, dual, offset):
    """Also with random block offsets (blocks still runs of <= B slots, so the key ranges hold)."""
    b = _batch(seq_len, block, dual, random_offset=offset)
    with torch.no_grad():
        ref = model(b.input_ids, b.position_ids, DenseAttention(b.attention_mask))
        out = model(b.input_ids, b.position_ids,
                    ChunkedDualStreamAttention(b.attention_mask, stream_len=seq_len, block_size=block, chunk=chunk))
    assert (ref - out).abs().max() < 1e-5


@pytest.mark.parametrize("seq_len,block,dual", [(40, 4, True), (64, 16, True), (48, 8, False)])
def test_flex_equals_dense(model, seq_len, block, dual):
    flex = pytest.importorskip("wedlm.train.flex")
    b = _batch(seq_len, block, dual, seed=1)
    meta = flex.slot_metadata(b.position_ids, seq_len, block)
    rule = flex.dual_stream_mask_mod(meta, block)
    n, s = b.position_ids.shape
    qi, ki = torch.arange(s)[:, None].expand(s, s), torch.arange(s)[None, :].expand(s, s)
    for i in range(n):  # the mask_mod evaluated everywhere equals the dense mask
        assert torch.equal(rule(torch.full((s, s), i), 0, qi, ki), b.attention_mask[i, 0])
    attn = flex.FlexDualStreamAttention.from_positions(b.position_ids, seq_len, block)
    with torch.no_grad():
        ref = model(b.input_ids, b.position_ids, DenseAttention(b.attention_mask))
        out = model(b.input_ids, b.position_ids, attn)
    assert (ref - out).abs().max() < 1e-5
