"""Where a model comes from: a checkpoint folder, a GGUF file or a Hugging Face hub id.

`resolve_model` is the one place every entry point turns its `model` argument into a
checkpoint folder (config.json + safetensors + tokenizer files): `LLM`, `load_model`,
`wedlm convert` and the command line's `--model` all call it.

* A folder is used as it is.
* A `.gguf` file is read by transformers' GGUF reader (metadata -> config, the
  file's tokenizer and chat template; quantized tensors dequantized to float32)
  and written once as a float32 folder under `cache_dir()/gguf/`; later loads of
  the same file (same path, size and modification time) reuse it.
* `org/name` that is not an existing path is a hub id: `huggingface_hub.snapshot_download`
  fetches the config, safetensors weights and tokenizer files (or finds them in the
  cache: `HF_HUB_OFFLINE=1`, `HF_HOME` / `HF_HUB_CACHE` are honoured), at `revision`.

Every failure is a `ModelSourceError` (an OSError) or FileNotFoundError whose message
names the source and says what was expected.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

GGUF_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# What a hub snapshot needs: config, safetensors weights (and their index), tokenizer and chat template files.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
EXPECTED = "expected a checkpoint folder (config.json + safetensors), a .gguf file or a hub id such as org/name"


class ModelSourceError(OSError):
    """A model argument that names no loadable model; the message names it and says why."""


def cache_dir() -> Path:
    """The engine's own cache: `$WEDLM_CACHE`, else ~/.cache/wedlm (GGUF conversions, fixtures)."""
    return Path(os.environ.get("WEDLM_CACHE") or Path.home() / ".cache" / "wedlm").expanduser()


def is_hub_id(source: str) -> bool:
    """True for `org/name` (one slash, hub characters) that is not an existing path."""
    return bool(_HUB_ID.fullmatch(source)) and ".." not in source and not Path(source).exists()


def resolve_model(source: str | Path, revision: str | None = None) -> Path:
    """The checkpoint folder for `source` (see the module docstring).

    Args:
        source: folder, `.gguf` file or hub id `org/name`.
        revision: branch, tag or commit of a hub id; None = "main". Only for hub ids.

    Returns:
        A folder with config.json (and, unless the checkpoint is incomplete, weights and tokenizer).

    Raises:
        FileNotFoundError: a path that does not exist and is not a hub id.
        ModelSourceError: a file that is not .gguf; an unreadable or unsupported GGUF file;
            a hub id not in the cache while offline, unknown, gated, or without safetensors
            weights; a revision given for a local path.
    """
    text = os.fspath(source)
    path = Path(text).expanduser()
    if path.is_dir() or path.is_file():
        if revision is not None:
            raise ModelSourceError(f"{text}: revision={revision!r} applies to hub ids only, not a local path")
        if path.is_dir():
            return path
        if path.suffix.lower() == ".gguf":
            return gguf_folder(path)
        raise ModelSourceError(f"{text}: is a file, not a model; {EXPECTED}")
    if is_hub_id(text):
        return hub_snapshot(text, revision)
    kind = ".gguf file" if path.suffix.lower() == ".gguf" else "checkpoint folder"
    raise FileNotFoundError(f"{text}: {kind} does not exist ({EXPECTED})")


# ---- hub ids --------------------------------------------------------------------------------

def hub_snapshot(repo_id: str, revision: str | None = None) -> Path:
    """`snapshot_download(repo_id, revision)` restricted to `HUB_PATTERNS`, with clear errors.

    Raises:
        ModelSourceError: not cached while offline (names the cache folder), no such repo or
            revision, a gated/private repo, no network and no cached copy, no safetensors weights.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"hub model {repo_id!r} (revision {revision or 'main'!r})"
    try:
        folder = Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except GatedRepoError:
        raise ModelSourceError(f"{where}: the repository is gated; accept its terms on huggingface.co and log "
                               "in (`hf auth login` or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelSourceError(f"{where}: no such repository on the Hugging Face Hub, or it is private "
                               f"(log in with `hf auth login` or HF_TOKEN); no local folder {repo_id} "
                               "exists either") from None
    except RevisionNotFoundError:
        raise ModelSourceError(f"{where}: the repository has no revision {revision!r}") from None
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ModelSourceError(f"{where}: not in the Hugging Face cache {constants.HF_HUB_CACHE} and "
                                   f"HF_HUB_OFFLINE=1 forbids downloading it; no local folder {repo_id} "
                                   "exists either") from None
        raise ModelSourceError(f"{where}: the Hub cannot be reached and the cache {constants.HF_HUB_CACHE} "
                               "has no copy") from None
    except HfHubHTTPError as err:
        raise ModelSourceError(f"{where}: download failed ({err})") from None
    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        found = sorted(p.name for p in folder.iterdir())
        raise ModelSourceError(f"{where}: the snapshot {folder} has no config.json and safetensors weights "
                               f"(files: {found}); a GGUF-only repository: download the .gguf file and pass "
                               "its path")
    return folder


# ---- GGUF files -----------------------------------------------------------------------------

def gguf_architecture(path: Path) -> str:
    """`general.architecture` of a GGUF file.

    Raises:
        ModelSourceError: not a readable GGUF file.
    """
    try:
        import gguf
    except ImportError:
        raise ModelSourceError(f"{path}: reading GGUF files needs the gguf package "
                               "(pip install 'wedlm[gguf]')") from None
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception as err:  # gguf raises ValueError / KeyError / struct errors on bad files
        raise ModelSourceError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from None


def gguf_folder(path: Path) -> Path:
    """The float32 checkpoint folder of GGUF file `path`, converted on first use.

    The folder is `cache_dir()/gguf/<key>/<file stem>`, `key` a hash of the resolved path,
    size and modification time; it is written to a temporary folder and renamed into place,
    so a folder that exists is complete.

    Raises:
        ModelSourceError: an unreadable file or an architecture outside GGUF_ARCHITECTURES.
    """
    path = path.resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / key / path.stem
    if (target / "config.json").is_file():
        return target
    arch = gguf_architecture(path)
    if arch not in GGUF_ARCHITECTURES:
        raise ModelSourceError(f"{path}: GGUF architecture {arch!r} is not supported; expected one of "
                               f"{GGUF_ARCHITECTURES}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        write_gguf_as_folder(path, tmp)
        tmp.chmod(0o755)  # mkdtemp's folder is private; the cache is shared like any other
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished first: its folder is complete
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def write_gguf_as_folder(path: Path, out: Path) -> Path:
    """Write GGUF file `path` into folder `out` as a float32 HF checkpoint with transformers'
    GGUF reader: config.json, model.safetensors, generation_config.json, tokenizer files.

    Raises:
        ModelSourceError: transformers cannot read the file (names the file and transformers' reason).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the GGUF reader's per-tensor progress and notes are noise here
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, OSError, RuntimeError) as err:
        raise ModelSourceError(f"{path}: transformers cannot read this GGUF file ({err})") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    # transformers marks a model read from GGUF as quantized and refuses `save_pretrained`; its
    # tensors are already dequantized, so they are written directly
    state = {name: t.detach().contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
