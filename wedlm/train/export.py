"""Export a trained checkpoint into a model folder: `python -m wedlm.train.export SRC DST`.

What: copies `config.json` and `model.safetensors` from SRC (a stage's `final/`)
into DST (e.g. models/wedlm-tiny, whose tokenizer files are left as they are)
and writes `generation_config.json` with the stop ids and the recommended
WeDLM decoding settings (window W, entropy threshold tau, position penalty
lambda; paper section 5.2), which the engine uses as this model's defaults.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

# Tuned on held-out tasks for models/wedlm-tiny (see its README.md).
DEFAULT_DECODING = {"wedlm_window_size": 16, "wedlm_entropy_threshold": 0.4, "wedlm_pos_penalty_factor": 0.02}


def generation_config(config: dict, decoding: dict | None = None, max_new_tokens: int = 1024) -> dict:
    """generation_config.json content: eos ids from config.json, greedy default, WeDLM settings."""
    eos = config.get("eos_token_id", [])
    eos = [eos] if isinstance(eos, int) else list(eos)
    return {"eos_token_id": eos, "pad_token_id": eos[0] if eos else None, "do_sample": False,
            "max_new_tokens": max_new_tokens, **DEFAULT_DECODING, **(decoding or {})}


def export(src: str | Path, dst: str | Path, decoding: dict | None = None) -> Path:
    """Copy weights + config from `src` to `dst` and write generation_config.json; returns `dst`."""
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src / name, dst / name)
    config = json.loads((src / "config.json").read_text())
    (dst / "generation_config.json").write_text(json.dumps(generation_config(config, decoding), indent=2) + "\n")
    return dst


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    args = p.parse_args(argv)
    print(f"exported to {export(args.src, args.dst)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
