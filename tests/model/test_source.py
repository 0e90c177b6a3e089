"""Model sources: hub ids through huggingface_hub's cache (offline, a temporary cache laid out as
huggingface_hub lays it out: models--org--name/{blobs, refs, snapshots}), revisions, and the errors
for every kind of source that names no model. No network."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from wedlm import LLM, SamplingParams
from wedlm.cli.main import main
from wedlm.convert import convert
from wedlm.model import CheckpointError, DenseAttention, ModelSourceError, load_model, resolve_model

MAIN_SHA = "a" * 40
V1_SHA = "b" * 40
REPO = Path(__file__).resolve().parents[2]


def add_snapshot(cache: Path, repo_id: str, ref: str, sha: str, src: Path) -> Path:
    """Put folder `src` into `cache` as huggingface_hub does: content-addressed blobs, a snapshot
    folder of relative symlinks, and refs/<ref> holding the commit."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / sha
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for f in sorted(src.iterdir()):
        data = f.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / f.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(sha)
    return snapshot


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory, tiny_wedlm, llama_factory):
    """org/tiny: main = the tiny WeDLM checkpoint, v1 = a tiny Llama; org/noweights: config only."""
    cache = tmp_path_factory.mktemp("hf-cache")
    add_snapshot(cache, "org/tiny", "main", MAIN_SHA, tiny_wedlm)
    add_snapshot(cache, "org/tiny", "v1", V1_SHA, llama_factory("hub_v1_llama", tokenizer=True, seed=7))
    config_only = tmp_path_factory.mktemp("config-only")
    shutil.copy(tiny_wedlm / "config.json", config_only / "config.json")
    add_snapshot(cache, "org/noweights", "main", MAIN_SHA, config_only)
    return cache


@pytest.fixture()
def offline(hub_cache, monkeypatch):
    """HF_HUB_OFFLINE=1 and HF_HUB_CACHE=the temporary cache, for this process (huggingface_hub
    reads both at import, so its constants are set too) and for spawned ones (the environment)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    return hub_cache


def test_hub_id_resolves_to_the_cached_snapshot(offline):
    assert resolve_model("org/tiny") == offline / "models--org--tiny" / "snapshots" / MAIN_SHA
    assert resolve_model("org/tiny", revision="v1") == offline / "models--org--tiny" / "snapshots" / V1_SHA
    assert resolve_model("org/tiny", revision=V1_SHA).name == V1_SHA


def test_llm_from_a_hub_id_equals_llm_from_the_folder(offline, tiny_wedlm):
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    hub = LLM("org/tiny", device="cpu")
    want = LLM(str(tiny_wedlm), device="cpu").generate(["Count: 1 2 3"], params)[0]
    assert hub.generate(["Count: 1 2 3"], params)[0]["token_ids"] == want["token_ids"]
    assert hub.model_path == "org/tiny" and hub.tokenizer is not None
    v1 = LLM("org/tiny", revision="v1", device="cpu")
    assert v1.engine.model.config.model_type == "llama"


def test_load_model_and_convert_take_hub_ids(offline, tiny_wedlm, tmp_path):
    ids = torch.arange(10)[None]
    a = load_model("org/tiny")(ids, ids, DenseAttention())
    b = load_model(tiny_wedlm)(ids, ids, DenseAttention())
    assert torch.equal(a, b)
    dst = convert("org/tiny", tmp_path / "converted", revision="v1")
    assert json.loads((dst / "config.json").read_text())["model_type"] == "wedlm"


def test_hub_errors_name_the_model_and_the_reason(offline):
    with pytest.raises(ModelSourceError, match=r"'org/missing' \(revision 'main'\): not in the Hugging Face "
                                               r"cache .*HF_HUB_OFFLINE=1"):
        resolve_model("org/missing")
    with pytest.raises(ModelSourceError, match=r"\(revision 'v9'\): not in the Hugging Face cache"):
        resolve_model("org/tiny", revision="v9")
    with pytest.raises(ModelSourceError, match=r"'org/noweights'.*has no config.json and safetensors weights"):
        resolve_model("org/noweights")


@pytest.mark.parametrize("error, message", [
    ("RepositoryNotFoundError", "no such repository on the Hugging Face Hub, or it is private"),
    ("GatedRepoError", "the repository is gated"),
    ("RevisionNotFoundError", "the repository has no revision 'nope'"),
])
def test_online_errors_are_clear(monkeypatch, error, message):
    """What the Hub answers for an unknown, gated or private repository or revision (the errors
    huggingface_hub raises, produced here without a network)."""
    import huggingface_hub
    from huggingface_hub import errors

    def refuse(repo_id, **kwargs):
        response = httpx.Response(404, request=httpx.Request("GET", f"https://huggingface.co/api/models/{repo_id}"))
        raise getattr(errors, error)("refused", response=response)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(ModelSourceError, match=message):
        resolve_model("org/secret", revision="nope")


def test_local_sources_that_are_not_models(tmp_path, tiny_wedlm):
    with pytest.raises(ModelSourceError, match=r"README.md: is a file, not a model; expected a checkpoint folder "
                                               r"\(config.json \+ safetensors\), a .gguf file or a hub id"):
        resolve_model(REPO / "README.md")
    with pytest.raises(FileNotFoundError, match="nope: checkpoint folder does not exist"):
        resolve_model(tmp_path / "nope")
    with pytest.raises(ModelSourceError, match="revision='v1' applies to hub ids only"):
        resolve_model(tmp_path, revision="v1")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model(tmp_path)
    shutil.copy(tiny_wedlm / "config.json", tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        load_model(tmp_path)


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench", "eval"])
def test_cli_model_errors_exit_2_without_traceback(command, capsys):
    assert main([command, "--model", str(REPO / "README.md")]) == 2
    err = capsys.readouterr().err
    assert f"wedlm {command}: error:" in err and "a .gguf file or a hub id" in err


def test_cli_convert_error_exits_2(tmp_path, capsys):
    assert main(["convert", str(REPO / "README.md"), str(tmp_path / "out")]) == 2
    assert "wedlm convert: error:" in capsys.readouterr().err


def test_cli_generate_reads_the_offline_cache_from_the_environment(offline, tiny_wedlm):
    """A fresh process: HF_HUB_OFFLINE and HF_HUB_CACHE come from the environment only."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    base = [sys.executable, "-m", "wedlm.cli.main", "generate", "--temperature", "0", "--max-tokens", "6",
            "--decoding", "ar", "--json", "Count: 1 2 3"]
    hub = subprocess.run([*base, "--model", "org/tiny"], env=env, capture_output=True, text=True, timeout=300)
    assert hub.returncode == 0, hub.stderr
    local = subprocess.run([*base, "--model", str(tiny_wedlm)], env=env, capture_output=True, text=True,
                           timeout=300)
    assert json.loads(hub.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]
    missing = subprocess.run([*base, "--model", "org/missing", "--revision", "v2"], env=env, capture_output=True,
                             text=True, timeout=300)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "wedlm generate: error: hub model 'org/missing' (revision 'v2'): not in the Hugging Face cache " \
           f"{offline}" in missing.stderr
