"""Mask probe: the batched windows give the same logits as one plain forward per probe position,
and the counts (slot accuracy, accepted fills) follow from those logits."""

import pytest
import torch

from wedlm.evaluate.mask_probe import ENTROPY_EDGES, ProbeResult, end_probe, probe, probe_inputs, probe_item
from wedlm.model import DenseAttention, load_model
from wedlm.testing import byte_tokenizer, make_hf_checkpoint


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = make_hf_checkpoint(tmp_path_factory.mktemp("probe"), vocab_size=260, wedlm=True, mask_token_id=259)
    return load_model(path, dtype="float32").eval()


def test_batched_windows_equal_separate_forwards(model):
    torch.manual_seed(0)
    ids = torch.randint(0, 250, (14,)).tolist()
    probes, W, mask = [5, 9, 13], 4, 259
    input_ids, positions, vis = probe_inputs(ids, 5, probes, W, mask)
    assert input_ids.shape == (1, 14 + 3 * 4) and vis.shape == (1, 1, 26, 26)
    with torch.no_grad():
        batched = model(input_ids, positions, DenseAttention(vis))[0]
        for k, p in enumerate(probes):
            alone_ids = torch.tensor([ids[:p] + [mask] * W])
            alone = model(alone_ids, torch.arange(p + W)[None], DenseAttention())[0]
            torch.testing.assert_close(batched[14 + k * W: 14 + (k + 1) * W], alone[p:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(batched[:14], model(torch.tensor([ids]), torch.arange(14)[None],
                                                       DenseAttention())[0], atol=1e-5, rtol=1e-5)


def test_counts_follow_the_logits(model):
    torch.manual_seed(1)
    end, mask, W = 258, 259, 3
    ids = torch.randint(0, 250, (9,)).tolist() + [end]
    result = ProbeResult(W, tau=10.0, lam=0.0)  # tau 10 nats: every fill is accepted
    probe_item(model, result, ids, 6, end, mask)
    n_probes = 4  # positions 6, 7, 8, 9 (the end token)
    assert result.slot_total == [n_probes] * W and result.ar_total == 4
    with torch.no_grad():
        right, end_right = [0] * W, [0] * W
        for p in range(6, 10):
            logits = model(torch.tensor([ids[:p] + [mask] * W]), torch.arange(p + W)[None], DenseAttention())[0, p:]
            logits[:, mask] = float("-inf")
            gold = (ids + [end] * W)[p:p + W]
            for d in range(W):
                right[d] += int(int(logits[d].argmax()) == gold[d])
            if 9 - p < W:  # the end (index 9) sits at slot 9 - p, after 9 - p masked answer tokens
                end_right[9 - p] += int(int(logits[9 - p].argmax()) == end)
    assert result.slot_right == right
    assert result.end_total == [1, 1, 1] and result.end_right == end_right  # p = 9, 8, 7; p = 6 has it at d = 3
    assert result.summary()["end_accuracy"] == [float(r) for r in end_right]
    assert sum(result.bucket_accepted) == n_probes * W and sum(result.bucket_right) == sum(right)
    strict = ProbeResult(W, tau=0.0, lam=0.0)  # nothing passes tau 0
    probe_item(model, strict, ids, 6, end, mask)
    assert sum(strict.bucket_accepted) == 0 and strict.summary()["accepted_right"] is None
    assert len(strict.summary()["buckets"]) == len(ENTROPY_EDGES) - 1


def test_probe_needs_a_mask_token(tmp_path):
    qwen = load_model(make_hf_checkpoint(tmp_path, vocab_size=260), dtype="float32")
    with pytest.raises(ValueError, match="mask_token_id"):
        probe(qwen, byte_tokenizer(260), [("a", "b")], 4, 0.4, 0.0, progress=False)


def test_end_probe_reads_the_end_token_probability_at_each_answer_position(model):
    tok = byte_tokenizer(260)
    end = tok.get_vocab()["<|im_end|>"]
    pairs = [("ab", "xyz"), ("hello", "q")]
    got = end_probe(model, tok, pairs, threshold=0.5, progress=False)
    at_end, early_max = [], []
    with torch.no_grad():
        for prompt, answer in pairs:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                           add_generation_prompt=True)
            head = tok(text, add_special_tokens=False)["input_ids"]
            body = tok(answer, add_special_tokens=False)["input_ids"]
            ids = head + body
            p = torch.softmax(model(torch.tensor([ids]), torch.arange(len(ids))[None], DenseAttention())[0], -1)
            p_end = p[len(head) - 1:, end]  # before the first answer token .. after the last
            assert len(p_end) == len(body) + 1
            at_end.append(float(p_end[-1]))
            early_max.append(float(p_end[:-1].max()))
    assert got["n"] == 2
    assert got["p_end_at_end_mean"] == pytest.approx(sum(at_end) / 2, abs=1e-6)
    assert got["p_end_early_max_median"] == pytest.approx(float(torch.tensor(early_max).median()), abs=1e-6)
    right = sum(a > 0.5 and e < 0.5 for a, e in zip(at_end, early_max))
    assert got["decided_right"] == right / 2
    loose = end_probe(model, tok, pairs, threshold=0.0, progress=False)  # every p_end > 0: never early < 0
    assert loose["decided_right"] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        end_probe(model, tok, [], progress=False)


def test_end_probe_on_the_shipped_model_stops_at_the_demo_end():
    from pathlib import Path

    from wedlm.tokenizer import load_tokenizer
    path = Path(__file__).resolve().parents[2] / "models" / "wedlm-tiny"
    shipped = load_model(path, dtype="float32").eval()
    got = end_probe(shipped, load_tokenizer(path), [("Count from 1 to 200.", ", ".join(map(str, range(1, 201))))],
                    progress=False)
    # greedy AR decoding of the demo stops exactly after 200 (README), so the end is decided there
    assert got["decided_right"] == 1.0 and got["p_end_at_end_median"] > 0.5
