"""Tensor-parallel worker processes never outlive their engine (CPU, gloo, 2 ranks).

Checked by PID after `del llm`, after an exception in the caller's `with` block,
after a failure on rank 0 in the middle of a forward (the other rank is then
waiting inside an all-reduce), after a worker is killed (a clear
`EngineDeadError` naming the rank and signal, not a hang), and, in a
subprocess, after Ctrl-C or a SIGKILL of rank 0. Each time the next engine
starts cleanly and the rendezvous port is released.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from wedlm import LLM, SamplingParams
from wedlm.engine.runner import EngineDeadError

QWEN3 = dict(family="qwen3", wedlm=True, tokenizer=True, seed=0)
ENGINE = dict(kv_block_size=4, wedlm_window_size=4, num_kv_blocks=24, device="cpu", dtype="float32")
AR = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, decoding="ar")


def worker_pids(llm: LLM) -> list[int]:
    return llm.engine.runner.workers.pids


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def small_tp(ckpt_factory) -> LLM:
    return LLM(str(ckpt_factory("tp_qwen3", **QWEN3)), tensor_parallel_size=2, **ENGINE)



def test_del_stops_the_workers_and_releases_the_port(ckpt_factory):
    llm = small_tp(ckpt_factory)
    pids, port = worker_pids(llm), llm.engine.runner.workers.port
    assert pids and not any(gone(p) for p in pids)
    assert len(llm.generate([[1, 2, 3]], AR)[0]["token_ids"]) == 4
    del llm  # reference counting collects it at once: no gc.collect() needed
    assert all(gone(p) for p in pids)
    assert port_is_free(port)


@pytest.mark.parametrize("when", ["idle", "mid-generation"])
def test_a_killed_worker_is_a_clear_error_and_the_next_engine_starts(ckpt_factory, when):
    """Killed between steps (seen before the broadcast) or during a long generation (seen
    inside a collective): either way the caller gets the rank and the signal, promptly."""
    llm = small_tp(ckpt_factory)
    pid = worker_pids(llm)[0]
    long = SamplingParams(temperature=0, max_tokens=80, ignore_eos=True, decoding="wedlm")
    if when == "idle":
        os.kill(pid, signal.SIGKILL)
    else:
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(EngineDeadError, match=rf"rank 1 \(pid {pid}\) was killed by signal 9 \(SIGKILL\)"):
        llm.generate([[1, 2, 3]] * 4, long)
    assert (when == "idle" or time.monotonic() - started > 0.5) and time.monotonic() - started < 30
    with pytest.raises(EngineDeadError, match="rank 1"):  # and stays dead
        llm.generate([[1, 2, 3]], AR)
    llm.close()
    again = small_tp(ckpt_factory)
    assert len(again.generate([[1, 2, 3]], AR)[0]["token_ids"]) == 4
    again.close()
    assert all(gone(p) for p in worker_pids(again))


def test_a_worker_that_fails_to_load_is_an_error_naming_it_and_leaves_no_process(ckpt_factory, tmp_path,
                                                                                 monkeypatch):
    """Rank 0 has loaded when the file goes bad; rank 1's CheckpointError reaches the caller."""
    import wedlm.engine.parallel.runner as tp_runner

    path = tmp_path / "ckpt"
    shutil.copytree(ckpt_factory("tp_qwen3", **QWEN3), path)
    real = tp_runner.WorkerGroup

    def corrupt_then_start(spec, *args, **kwargs):
        (path / "model.safetensors").write_bytes(b"not a safetensors file")
        return real(spec, *args, **kwargs)

    monkeypatch.setattr(tp_runner, "WorkerGroup", corrupt_then_start)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError, match=r"tensor-parallel rank 1 failed while loading: CheckpointError: .*"
                                           r"model.safetensors"):
        LLM(str(path), tensor_parallel_size=2, **ENGINE)
    assert {c.pid for c in psutil.Process().children(recursive=True)} == before


def test_a_failure_on_rank_0_mid_forward_stops_every_rank(ckpt_factory):
    llm = small_tp(ckpt_factory)
    pids = worker_pids(llm)
    mlp = llm.engine.model.model.layers[1].mlp

    def broken(x):
        raise RuntimeError("injected rank-0 failure")

    mlp.forward = broken  # rank 1 is now waiting in layer 0's or 1's all-reduce
    with pytest.raises(EngineDeadError, match="rank 0: RuntimeError: injected rank-0 failure"):
        llm.generate([[1, 2, 3]], AR)
    assert all(gone(p) for p in pids)
    llm.close()


def test_an_exception_in_the_callers_block_stops_the_workers(ckpt_factory):
    with pytest.raises(KeyError):
        with small_tp(ckpt_factory) as llm:
            pids = worker_pids(llm)
            raise KeyError("caller failure")
    assert all(gone(p) for p in pids)


SCRIPT = """
import signal, sys, time, torch
# Ctrl-C raises KeyboardInterrupt as in a terminal, even when the test run itself was started
# with SIGINT ignored (a background job of a non-interactive shell, nohup): that is inherited
signal.signal(signal.SIGINT, signal.default_int_handler)
torch.set_num_threads(1)
from wedlm import LLM, SamplingParams
llm = LLM(sys.argv[1], tensor_parallel_size=2, kv_block_size=4, wedlm_window_size=4, device="cpu")
print(" ".join(map(str, llm.engine.runner.workers.pids)), flush=True)
p = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True, decoding="ar")
while True:
    llm.generate([[1, 2, 3]], p)
"""


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "rank-0-killed"])
def test_ctrl_c_or_a_killed_rank_0_leaves_no_worker(ckpt_factory, tmp_path, how):
    script = tmp_path / "tp_loop.py"
    script.write_text(textwrap.dedent(SCRIPT))
    path = str(ckpt_factory("tp_qwen3", **QWEN3))
    proc = subprocess.Popen([sys.executable, str(script), path], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, "the script did not start its engine"
        time.sleep(1.0)  # mid-generation
        os.killpg(proc.pid, how)  # Ctrl-C reaches the whole foreground process group
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(gone(p) for p in pids):
            time.sleep(0.1)
        assert all(gone(p) for p in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
