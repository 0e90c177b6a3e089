"""evaluate_task end to end: an oracle fake LLM scores 100%, the real engine on a tiny random model
reports consistent speed metrics, and `wedlm eval` writes its JSON."""

import json

import pytest
import torch

from wedlm.cli.main import main
from wedlm.evaluate.gsm8k import gsm8k_task
from wedlm.evaluate.runner import WARM_UP_TOKENS, DecodeConfig, evaluate, evaluate_task, render_prompts, use_chat
from wedlm.evaluate.synthetic import synthetic_task
from wedlm.testing import byte_tokenizer


class OracleLLM:
    """Answers every prompt with the text in `answers` (keyed by prompt token ids); AR-like stats."""

    def __init__(self, answers):
        self.tokenizer, self.answers, self.calls = byte_tokenizer(260), answers, []

    def reset_prefix_cache(self):
        self.calls.append(("reset", None))
        return True

    def generate(self, prompts, params):
        self.calls.append((len(prompts), params[0]))
        out = []
        for p in prompts:
            text = self.answers[tuple(p)]
            n = len(text)
            out.append({"text": text + "\nQuestion: junk", "token_ids": list(range(n)), "finish_reason": "stop",
                        "stats": {"decode_tokens": n, "decode_forwards": n, "fed_tokens": n, "ttft_s": 0.01}})
        return out


@pytest.fixture
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _gsm8k_oracle(tmp_path):
    """A 1-shot GSM8K task of 6 sums (5 scored) and an `OracleLLM` that answers each correctly."""
    records = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(6)]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    task = gsm8k_task(path, n_shot=1)
    llm = OracleLLM({})
    prompts = render_prompts(llm.tokenizer, task.items, chat=False)
    llm.answers = {tuple(p): f" so #### {item.reference}" for p, item in zip(prompts, task.items)}
    return task, llm


def test_oracle_answers_score_100_percent_and_stops_are_cut(tmp_path):
    task, llm = _gsm8k_oracle(tmp_path)
    report = evaluate_task(llm, task, DecodeConfig(decoding="ar"), prompt_style="raw", batch_size=2,
                           progress=False)
    assert report["n"] == 5 and report["correct"] == 5 and report["accuracy"] == 1.0
    assert [n for n, _ in llm.calls] == [2, 2, 1]
    params = llm.calls[0][1]
    assert params.temperature == 0.0 and params.decoding == "ar" and "\nQuestion:" in params.stop_strings
    assert all("Question" not in s["output"] for s in report["samples"])
    assert report["metrics"]["tokens_per_forward"] == 1.0 and report["prompt_style"] == "raw"


def test_evaluate_warms_up_each_batch_shape_before_timing(tmp_path):
    """The compiled forward builds a graph per batch shape on first use; `evaluate` runs those
    generations untimed (batch 1 and the batch size) before the scored ones, then empties the
    prefix cache so the scored ones start cold."""
    task, llm = _gsm8k_oracle(tmp_path)
    reports = evaluate(llm, [task], DecodeConfig(decoding="wedlm", tau=0.3), prompt_style="raw", batch_size=3,
                       progress=False)
    assert [n for n, _ in llm.calls] == [1, 3, "reset", 3, 2]
    warm, timed = llm.calls[:2], llm.calls[3:]
    assert all(p.max_tokens == WARM_UP_TOKENS and p.decoding == "wedlm" for _, p in warm)
    assert all(p.max_tokens == task.max_tokens for _, p in timed)
    assert warm[0][1].wedlm_entropy_threshold == timed[0][1].wedlm_entropy_threshold == 0.3
    assert len(reports) == 1 and reports[0]["n"] == 5 and reports[0]["correct"] == 5
    assert reports[0]["metrics"]["decode_tokens"] == sum(len(f" so #### {i.reference}") for i in task.items)


def test_engine_on_tiny_random_model(ckpt_factory, single_thread):
    from wedlm import LLM

    path = ckpt_factory("eval-wedlm", wedlm=True, tokenizer=True, vocab_size=260)
    llm = LLM(model=str(path), device="cpu", dtype="float32", max_num_seqs=4)
    assert use_chat(llm.tokenizer, "auto")
    task = synthetic_task("arithmetic", n=3, max_tokens=5)
    reports = {d: evaluate_task(llm, task, DecodeConfig(decoding=d), batch_size=2, samples=3, progress=False)
               for d in ("ar", "wedlm")}
    for d, r in reports.items():
        m = r["metrics"]
        assert r["n"] == 3 and r["prompt_style"] == "chat" and r["decode"]["decoding"] == d
        assert 0 < m["decode_tokens"] <= 15 and m["tokens_per_s"] > 0 and m["ttft_s"] > 0
        rescored = [task.score(i, s["output"]).correct for i, s in zip(task.items, r["samples"])]
        assert [s["correct"] for s in r["samples"]] == rescored
        assert r["accuracy"] == sum(rescored) / 3
    assert reports["ar"]["metrics"]["p_cache"] == 1.0
    assert reports["ar"]["metrics"]["tokens_per_forward"] == 1.0


def test_eval_cli_writes_json(ckpt_factory, single_thread, tmp_path, capsys):
    path = ckpt_factory("eval-wedlm", wedlm=True, tokenizer=True, vocab_size=260)
    out = tmp_path / "eval.json"
    rc = main(["eval", "--model", str(path), "--tasks", "counting,equation", "--limit", "2", "--max-tokens", "3",
               "--decoding", "wedlm,ar", "--out", str(out)])
    assert rc == 0
    saved = json.loads(out.read_text())
    assert [(r["task"], r["decode"]["decoding"]) for r in saved["results"]] == [
        ("counting", "wedlm"), ("equation", "wedlm"), ("counting", "ar"), ("equation", "ar")]
    assert saved["machine"]["torch"]
    assert "tok/fwd" in capsys.readouterr().out
