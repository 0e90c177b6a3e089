"""Which malloc the process runs (`hardware.process_allocator`) and the engine's start-log hint."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wedlm.hardware import process_allocator

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


@pytest.mark.parametrize("library,name", [
    ("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4.5.10", "tcmalloc"),
    ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "jemalloc"),
    ("/opt/lib/libmimalloc.so.2", "mimalloc"),
    ("/lib/x86_64-linux-gnu/libc.so.6", "glibc"),
    ("/opt/libtcmalloc-build/libc.so.6", "glibc"),  # a folder's name is not the library
])
def test_process_allocator_names_the_library_malloc_resolves_to(library, name):
    assert process_allocator(library) == name


@pytest.mark.skipif(not TCMALLOC.exists(), reason="needs libtcmalloc-minimal4")
def test_a_preloaded_tcmalloc_is_seen_and_a_dlopened_one_is_not():
    code = "from wedlm.hardware import process_allocator; print(process_allocator())"
    env = dict(os.environ, LD_PRELOAD=str(TCMALLOC))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "tcmalloc"
    env.pop("LD_PRELOAD")
    # loaded later by dlopen, it does not replace the process's malloc
    code = f"import ctypes; ctypes.CDLL({str(TCMALLOC)!r}); {code}"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "glibc"


def test_a_cpu_engine_on_glibc_says_how_to_preload_tcmalloc(tiny_path, caplog):
    if process_allocator() != "glibc":
        pytest.skip("this process runs another malloc")
    from wedlm import LLM

    with caplog.at_level(logging.INFO, logger="wedlm.engine"):
        LLM(str(tiny_path), device="cpu", enforce_eager=True)
    hints = [r.getMessage() for r in caplog.records if "TCMalloc" in r.getMessage()]
    assert hints == ["engine: glibc's malloc; TCMalloc preloaded (LD_PRELOAD=libtcmalloc_minimal.so.4) runs a "
                     "CPU step ~8% faster (docs/engine.md, \"The memory allocator\")"]


def test_reports_name_a_malloc_other_than_the_systems():
    from wedlm.evaluate.machine import machine_info, machine_line

    info = machine_info("cpu")
    assert info["malloc"] == process_allocator()
    base = {**info, "gpu": None, "cpu": "X", "cpu_count": 2, "torch_threads": 1}
    assert machine_line({**base, "malloc": "tcmalloc"}).startswith("CPU X (2 cores, 1 torch threads, tcmalloc malloc), ")
    assert machine_line({**base, "malloc": "glibc"}).startswith("CPU X (2 cores, 1 torch threads), ")
