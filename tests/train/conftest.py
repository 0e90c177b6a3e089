"""Fixtures for training tests: a byte-level tokenizer folder and tiny JSONL corpora."""

import json

import pytest

from wedlm.testing import byte_tokenizer


@pytest.fixture(scope="session")
def train_env(tmp_path_factory):
    """Folder with tokenizer/, text.jsonl (counting) and chat.jsonl; returns a dict of paths."""
    root = tmp_path_factory.mktemp("train_env")
    byte_tokenizer(260).save_pretrained(root / "tokenizer")
    texts = [{"text": "count: " + " ".join(str(i) for i in range(a, a + 12))} for a in range(0, 60)]
    (root / "text.jsonl").write_text("".join(json.dumps(t) + "\n" for t in texts))
    chats = [{"messages": [{"role": "user", "content": f"next after {a}?"},
                           {"role": "assistant", "content": str(a + 1)}]} for a in range(40)]
    (root / "chat.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    return {"root": root, "tokenizer": str(root / "tokenizer"), "text": str(root / "text.jsonl"),
            "chat": str(root / "chat.jsonl")}


MODEL = dict(model_type="wedlm", vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
             tie_word_embeddings=True)


@pytest.fixture
def make_cfg(train_env):
    """make_cfg(out_dir, **overrides) -> dict of TrainConfig fields for a tiny stage."""
    return lambda out_dir, **overrides: base_config(train_env, out_dir, **overrides)


def base_config(env, out_dir, **overrides) -> dict:
    cfg = dict(stage="wedlm", data=env["text"], tokenizer=env["tokenizer"], out_dir=str(out_dir), model=dict(MODEL),
               seq_len=64, micro_batch=2, grad_accum=2, block_size=4, lr=3e-3, min_lr=3e-4, warmup_steps=2,
               max_steps=8, save_every=100, log_every=1, seed=3)
    cfg.update(overrides)
    return cfg
