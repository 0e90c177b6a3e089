"""The machine and software versions a measurement ran on, as a dict and as one line.

Why: a tokens/s figure means nothing without the CPU/GPU, thread count and
library versions beside it; every `wedlm eval` and `wedlm bench` report carries this
(it lives in `evaluate`, the base that `bench` builds on).
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

from wedlm.hardware import cpu_model, process_allocator  # cpu_model re-exported: bench reports name the CPU


def git_commit(root: Path | None = None) -> str | None:
    """Short commit hash of the repository holding this package, or None."""
    root = root or Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info(device: str = "cpu") -> dict:
    """Platform, CPU, cores, torch threads, GPU (when `device` is CUDA), the process's malloc
    (`hardware.process_allocator`) and versions."""
    import torch
    import transformers

    import wedlm

    info = {"platform": platform.platform(), "cpu": cpu_model(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "device": device, "gpu": None,
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "wedlm": wedlm.__version__,
            "git_commit": git_commit(), "malloc": process_allocator()}
    if str(device).startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def machine_line(info: dict) -> str:
    """One human line: "CPU <model> (<n> cores, <t> torch threads), <platform>; Python ..., torch ...",
    with the malloc where it is not the system's (a preloaded TCMalloc speeds a CPU step up)."""
    where = f"GPU {info['gpu']}" if info.get("gpu") else (
        f"CPU {info['cpu']} ({info['cpu_count']} cores, {info['torch_threads']} torch threads"
        + (f", {info['malloc']} malloc" if info.get("malloc") not in (None, "glibc", "system") else "") + ")")
    commit = f" @ {info['git_commit']}" if info.get("git_commit") else ""
    return (f"{where}, {info['platform']}; Python {info['python']}, torch {info['torch']}, "
            f"transformers {info['transformers']}, wedlm {info['wedlm']}{commit}")
