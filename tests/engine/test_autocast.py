"""bf16 autocast on CPU: chosen from the processor's bf16 matrix units, forced by `autocast=True`
(this machine may have none: the bf16 path is checked for correctness here, not speed)."""

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.engine.config import resolve_autocast

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("requested,device,dtype,flags,expected", [
    (None, CPU, "float32", {"avx2"}, None),
    (None, CPU, "float32", {"avx2", "amx_bf16"}, torch.bfloat16),
    (None, CPU, "float32", {"avx512_bf16"}, torch.bfloat16),
    (None, CUDA, "float32", {"amx_bf16"}, None),
    (None, CPU, "bfloat16", {"amx_bf16"}, None),
    (True, CPU, "float32", {"avx2"}, torch.bfloat16),
    (False, CPU, "float32", {"amx_bf16"}, None),
])
def test_resolve_autocast(requested, device, dtype, flags, expected):
    assert resolve_autocast(requested, device, dtype, flags) is expected


def test_forced_autocast_needs_float32_weights():
    with pytest.raises(ValueError, match="autocast=True needs float32 weights"):
        resolve_autocast(True, CPU, "bfloat16", set())


def test_forced_bf16_autocast_runs_in_bf16_and_stays_close(tiny_path):
    plain = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=False)
    bf16 = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    assert bf16.engine.precision == "float32 weights, bf16 autocast (forced)"
    assert plain.engine.precision == "float32 weights, no autocast (off)"
    seen = []
    bf16.engine.runner.model.lm_head.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    params = SamplingParams(temperature=0.0, max_tokens=6, decoding="ar", ignore_eos=True)
    out = bf16.generate([[5, 9, 14]], params)[0]
    assert len(out["token_ids"]) == 6 and seen and set(seen) == {torch.bfloat16}
    # one forward's logits: bf16 against fp32, within bf16 rounding of their scale
    from wedlm.engine.runner import ForwardItem

    item = ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0], 0, [0, 1, 2, 3])
    a = plain.engine.runner.run([item])[0].logits
    b = bf16.engine.runner.run([item])[0].logits
    assert b.dtype == torch.float32
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b))
    assert (a[finite] - b[finite]).abs().max() <= 0.05 * a[finite].abs().max()


def test_bf16_pads_one_token_eager_steps_only_on_cpu(tiny_path):
    bf16 = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=True)
    plain = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=False)
    assert bf16.engine.runner.pad_single_token and not plain.engine.runner.pad_single_token
    from wedlm.engine.runner import ForwardItem

    one = bf16.engine.runner.prepare([ForwardItem([7], [5], [0, 1], 5, [0])])
    assert one.input_ids.tolist() == [7, 0] and one.num_rows == 1
    assert one.attn.slot_mapping.tolist() == [5, bf16.engine.runner.pad_slot]
    two = bf16.engine.runner.prepare([ForwardItem([7, 8], [5, 6], [0, 1], 5, [1])])
    assert two.input_ids.tolist() == [7, 8]  # only one-token steps are padded


@pytest.mark.parametrize("decoding", ["ar", "wedlm", "verified"])
def test_padded_one_token_steps_change_nothing(tiny_path, decoding):
    """The padded row is nobody's query and writes only the scratch slot: fp32 with the padding
    forced gives the unpadded run's tokens, and the same logits to 1e-5."""
    from wedlm.engine.runner import ForwardItem

    plain = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=False)
    padded = LLM(str(tiny_path), kv_block_size=4, wedlm_window_size=4, device="cpu", autocast=False)
    padded.engine.runner.pad_single_token = True
    params = SamplingParams(temperature=0.0, max_tokens=12, decoding=decoding, ignore_eos=True)
    prompts = [[5, 9, 14], [4, 8, 8, 21, 30]]
    assert [o["token_ids"] for o in padded.generate(prompts, params)] == \
        [o["token_ids"] for o in plain.generate(prompts, params)]
    for llm in (plain, padded):  # the same cache rows 0..3, then one cached-context token
        llm.engine.runner.run([ForwardItem([5, 9, 14, 20], [0, 1, 2, 3], [0, 1], 0, [3])])
    a = plain.engine.runner.run([ForwardItem([11], [4], [0, 1], 4, [0])])[0].logits
    b = padded.engine.runner.run([ForwardItem([11], [4], [0, 1], 4, [0])])[0].logits
    finite = torch.isfinite(a)
    assert torch.equal(finite, torch.isfinite(b)) and torch.allclose(a[finite], b[finite], atol=1e-5)
