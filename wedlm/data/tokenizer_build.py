"""Train the tiny WeDLM model's byte-level BPE tokenizer.

What: trains a ~4k-token byte-level BPE (HF ``tokenizers``) on a mix of the
synthetic task text and the stdlib code train split, and saves it as a
Hugging Face tokenizer folder (``AutoTokenizer.from_pretrained`` loads it)
with a ChatML chat template.

Why: no tokenizer can be downloaded, and the tiny model needs a small vocab
(embedding rows dominate a ~3M-parameter model). Digits are split one per
token, as in Qwen's tokenizer that the released WeDLM models use, so counting
and arithmetic look to the model as they do at scale and tokens-per-forward
numbers stay comparable. Special ids are fixed: ``<|endoftext|>`` 0,
``<|im_start|>`` 1, ``<|im_end|>`` 2, ``<|mask|>`` 3 (the model's
``mask_token_id``; wedlm-facts §1).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from wedlm.data import synthetic
from wedlm.data.code_corpus import code_documents

ENDOFTEXT, IM_START, IM_END, MASK = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, MASK]  # ids 0, 1, 2, 3 in this order
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MODEL_MAX_LENGTH = 4096

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def training_texts(seed: int = synthetic.TRAIN_BASE_SEED, synthetic_chars: int = 2_000_000,
                   code_chars: int = 3_000_000) -> Iterator[str]:
    """Yield the BPE training mix: synthetic task text, then stdlib code (train split only).

    Synthetic examples use training seeds only (``seed`` + offset 900, a stream
    the dataset builder does not use), so no held-out item leaks in.
    """
    per_task = max(1, synthetic_chars // (len(synthetic.TASKS) * 250))
    for task in synthetic.TASKS:
        total = 0
        for ex in synthetic.train_examples(task, per_task, offset=900, base_seed=seed):
            text = synthetic.to_text(ex)
            total += len(text)
            yield text
            if total >= synthetic_chars // len(synthetic.TASKS):
                break
    yield from code_documents("train", max_chars=code_chars)


def train_bpe(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE with single-digit pre-tokenization and ids 0-3 reserved."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap_for_hf(tok: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a trained ``Tokenizer`` with special-token roles and the ChatML template."""
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        additional_special_tokens=[IM_START, IM_END, MASK],
        clean_up_tokenization_spaces=False,
        model_max_length=MODEL_MAX_LENGTH,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def tokenizer_config() -> dict:
    """The ``tokenizer_config.json`` contents, readable by transformers 4.x and 5.x alike."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "mask_token": MASK,
        "additional_special_tokens": [IM_START, IM_END, MASK],
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict:
    """The ``special_tokens_map.json`` contents (roles of the special tokens)."""
    return {"eos_token": ENDOFTEXT, "pad_token": ENDOFTEXT, "mask_token": MASK,
            "additional_special_tokens": [IM_START, IM_END, MASK]}


def save_tokenizer_files(tok: Tokenizer, out_dir: str | os.PathLike) -> list[Path]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``out_dir``.

    Each file is written to a temporary name and renamed into place, so a reader
    never sees a half-written file; other files in ``out_dir`` (weights,
    config.json) are left untouched.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    payloads = {
        "tokenizer.json": tok.to_str(pretty=True),
        "tokenizer_config.json": json.dumps(tokenizer_config(), indent=2) + "\n",
        "special_tokens_map.json": json.dumps(special_tokens_map(), indent=2) + "\n",
    }
    written = []
    for name, text in payloads.items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, out / name)
        written.append(out / name)
    return written


def build_tokenizer(out_dir: str | os.PathLike | None, vocab_size: int = 4096,
                    seed: int = synthetic.TRAIN_BASE_SEED, synthetic_chars: int = 2_000_000,
                    code_chars: int = 3_000_000) -> PreTrainedTokenizerFast:
    """Train, wrap and (if ``out_dir`` is given) save the tokenizer; returns the HF tokenizer.

    Args:
        out_dir: folder for tokenizer.json / tokenizer_config.json / special_tokens_map.json
            (the chat template lives in tokenizer_config.json); None = don't save.
        vocab_size: target vocabulary size including the 4 special tokens.
        seed: training base seed for the synthetic part of the mix.
        synthetic_chars, code_chars: size of the training mix in characters.
    """
    tok = train_bpe(training_texts(seed, synthetic_chars, code_chars), vocab_size)
    if out_dir is not None:
        save_tokenizer_files(tok, out_dir)
    return wrap_for_hf(tok)
