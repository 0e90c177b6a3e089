"""The engine's C++ CPU operators (`csrc/`), built on first use and cached on disk.

`load()` builds `csrc/` with the system's C++ compiler (the one inductor's compiled forward
needs anyway) through `torch.utils.cpp_extension`, once per machine, torch version, source and
instruction set: the library lands in `cache_dir()/torch-extensions/<torch version>/` and a later
process only loads it (10-18 s to build on one Zen 4 core, ~10 ms to load). It is built for the
widest vector instruction set the CPU has (`instruction_set`: AVX-512, AVX2 with FMA, or the
compiler's baseline), whose registers the kernels' vectors match (`csrc/simd.h`); a cache folder
shared by machines with other CPUs keeps one build per set. Compiled CPU graphs call its
operators (`fast_model.use_native_ops`):

* `torch.ops.wedlm_cpu.linear`: the float32 matmul of two or more rows (`fast_model.onednn_linear`,
  `fast_model.panel_linear`) and the bf16 one on bf16 panels (`fast_model.bf16_panel_linear`):
  `few_rows_mm` up to `fast_model.FEW_ROWS_MAX` rows, else oneDNN on
  a prepacked weight where the CPU takes oneDNN, else BLAS, with
  `torch.ops.wedlm_cpu.remember` for the prepacked weights' keys. Compiled graphs call it as
  `torch.ops.wedlm_cpu.bound_linear(x, key, n)`, the weight, bias, panels and thresholds bound to
  the key once (`bind_linear`, `fast_model.bind_linears`), so that they are no graph inputs. The
  oneDNN operator written in Python costs one call into the interpreter per matmul (a batch-1
  `wedlm` step of the shipped model took ~1.14x the time with it).
* `torch.ops.wedlm_cpu.few_rows_mm`: x[M, K] @ W^T on W packed in column panels
  (`fast_model.pack_panels`, 16 columns wide), a register-tiled loop that runs the matmuls of decode
  windows and short prefills at the core's FMA rate (oneDNN ran the shipped model's 16-row
  matmuls at 45-100 GFLOP/s on a Zen 4 core, this loop at ~113; MKL at 59-63 on a Zen 3 core, this
  loop at 77-85; the same float32 sums in the same order for K <= 512, so the same values as
  oneDNN there). On bf16 panels (CPUs with AVX512-BF16) it is bf16 autocast's matmul
  (`fast_model.bf16_panel_linear`): SmolLM2-135M's batch-1 `ar` step took half the time of
  oneDNN's bf16 matmuls on a Xeon with AMX.
* `torch.ops.wedlm_cpu.one_row_mm`: x[1, K] @ weight_t[K, N], the one-row float32 matmuls of a
  batch-1 `ar` step (`fast_model.one_row_linear`), a loop that streams the weights faster than
  torch's BLAS does on AMD CPUs (its kernel there is 4-wide SSE).
* `torch.ops.wedlm_cpu.one_query_attention`: the same step's attention, one query per head over
  exactly the sequence's keys (`PagedAttention.attend`), 1.8-2x faster than SDPA's flash kernel
  over 100-1000 keys.
* `torch.ops.wedlm_cpu.window_attention`: every other step's attention (a window of queries, or a
  prefill, with its mask), 0.44-0.71x SDPA's time for the shipped model's shapes.
  Both read the keys and values in place in the paged KV cache through the step's slot table
  (`slots`), where SDPA needs them gathered into a [B, Hkv, Lk, D] copy first.
* `torch.ops.wedlm_cpu.greedy_scores`: each logit row's softmax entropy and first maximum in two
  passes, for the fill rule of greedy requests (`sampling.SoftmaxRows`, called by the decoders,
  not by graphs); `decoders.fill` decides with it only where the exact entropy would decide alike.
* `torch.ops.wedlm_cpu.step_inputs`: every int64 input of a compiled CPU step of one sequence
  (ids, positions, logit rows and the paged-attention metadata) in one call
  (`runner.ModelRunner._prepare_one`), the values of the numpy build.
* `torch.ops.wedlm_cpu.row_argmax`: the forward's greedy ids, `argmax(-1)` of its logits
  (`fast_model.row_argmax`), which torch computes one value at a time (~80 us for 16 x 4096).

Compiled graphs call `bound_linear`, the two attention operators and `row_argmax` as C functions
(`C_SHIMS`), not through the dispatcher.

Without a compiler or with a failed build `load()` returns False, logs why once, and compiled
graphs keep torch's kernels (the Python oneDNN operator, BLAS, SDPA; same tokens).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import sys
import threading
from pathlib import Path

import torch

from ..hardware import cpu_flags, cpu_is_x86
from ..model.source import cache_dir

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
# one translation unit that includes the others (`csrc/wedlm_cpu.cpp`: torch's headers parsed once)
SOURCE = CSRC / "wedlm_cpu.cpp"

# compiler flags of each instruction set the library is built for (GCC and Clang spellings)
ISA_FLAGS = {"avx512": ["-mavx512f", "-mavx2", "-mfma"], "avx2": ["-mavx2", "-mfma"], "base": []}
# OpenMP, which ATen's `at::parallel_for` (every operator's split over columns, rows or heads) runs
# on: in a library built without it the call is a plain serial loop, whatever torch's thread
# count. torch's Linux wheels use GNU OpenMP (their own libgomp.so.1, which the library then
# shares); inductor builds its kernels the same way.
OPENMP_FLAGS = ["-fopenmp"] if sys.platform.startswith("linux") else []

_lock = threading.Lock()
_state: dict[str, bool] = {}


def build_dir() -> Path:
    """Where the built library is kept: one folder per torch version."""
    return cache_dir() / "torch-extensions" / torch.__version__.replace("+", "-")


def load() -> bool:
    """Build (first time) or load the C++ operators; True when `torch.ops.wedlm_cpu` has them.

    Thread-safe and idempotent: the first call decides for the process. Never raises: a missing
    compiler, `ninja` or a failed build returns False and logs the reason once at WARNING.
    """
    with _lock:
        if "loaded" not in _state:
            _state["loaded"] = _build()
        return _state["loaded"]


def instruction_set(flags: set[str] | None = None, machine: str | None = None) -> str:
    """The vector instruction set the C++ operators are built for here: "avx512" (an x86-64 CPU with
    AVX-512F, AVX2 and FMA), "avx2" (AVX2 and FMA) or "base" (the compiler's default for the
    machine: SSE2 on x86-64, NEON on arm64). `flags` and `machine` default to this CPU's
    (/proc/cpuinfo, `platform.machine()`)."""
    if not cpu_is_x86(machine):
        return "base"
    flags = cpu_flags() if flags is None else flags
    if {"avx512f", "avx2", "fma"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma"} <= flags else "base"


def _build() -> bool:
    digest, isa = sources_digest(), instruction_set()
    # the sources' hash in the name: an edited source builds anew instead of loading a stale
    # library; the instruction set: a build for another CPU's would stop this one (SIGILL)
    name = f"wedlm_cpu_{isa}_{digest[:12]}"
    folder = build_dir() / name
    built = folder / f"{name}.so"
    try:
        if built.is_file():  # the name pins the sources and the folder the torch version: load it as is
            torch.ops.load_library(str(built))
        else:
            from torch.utils import cpp_extension

            folder.mkdir(parents=True, exist_ok=True)
            log.info("building the engine's C++ operators (%s) into %s (once per machine and torch version)", isa,
                     folder)
            cpp_extension.load(name=name, sources=[str(SOURCE)], build_directory=str(folder),
                               is_python_module=False, extra_cflags=["-O3", *ISA_FLAGS[isa], *OPENMP_FLAGS],
                               extra_ldflags=list(OPENMP_FLAGS), verbose=False)  # a copy: torch appends to it
        # the library's symbols global: compiled graphs call its C shims (`C_SHIMS`) by name
        ctypes.CDLL(str(built), mode=os.RTLD_GLOBAL)
    except Exception as err:  # any build or load failure leaves the Python operator in place
        log.warning("C++ operators not built (%s: %s); the compiled forward keeps torch's kernels",
                    type(err).__name__, str(err).strip().splitlines()[-1] if str(err).strip() else "")
        return False
    torch.library.register_fake("wedlm_cpu::linear")(_linear_fake)
    torch.library.register_fake("wedlm_cpu::bound_linear")(_bound_linear_fake)
    torch.library.register_fake("wedlm_cpu::few_rows_mm")(_few_rows_mm_fake)
    torch.library.register_fake("wedlm_cpu::one_row_mm")(_one_row_mm_fake)
    torch.library.register_fake("wedlm_cpu::one_query_attention")(_one_query_attention_fake)
    torch.library.register_fake("wedlm_cpu::window_attention")(_window_attention_fake)
    torch.library.register_fake("wedlm_cpu::row_argmax")(_row_argmax_fake)
    return True


# The operators compiled graphs call as C functions (inductor's `custom_ops_to_c_shims`), with the
# declaration of each: no dispatcher lookup, stack or boxing per call (`csrc/linear.cpp`).
C_SHIMS = {
    "wedlm_cpu::bound_linear": "AOTITorchError aoti_torch_cpu_bound_linear(AtenTensorHandle x, int64_t key, "
                               "int64_t n, AtenTensorHandle* ret0)",
    "wedlm_cpu::window_attention": "AOTITorchError aoti_torch_cpu_window_attention(AtenTensorHandle q, "
                                   "AtenTensorHandle k, AtenTensorHandle v, AtenTensorHandle* mask, double scale, "
                                   "AtenTensorHandle* slots, AtenTensorHandle* key_ends, AtenTensorHandle* ret0)",
    "wedlm_cpu::one_query_attention": "AOTITorchError aoti_torch_cpu_one_query_attention(AtenTensorHandle q, "
                                      "AtenTensorHandle k, AtenTensorHandle v, double scale, AtenTensorHandle* slots, "
                                      "AtenTensorHandle* ret0)",
    "wedlm_cpu::row_argmax": "AOTITorchError aoti_torch_cpu_row_argmax(AtenTensorHandle logits, AtenTensorHandle* ret0)",
}


def c_shims() -> dict:
    """inductor's `aot_inductor.custom_ops_to_c_shims` for the loaded operators (empty before `load`)."""
    return _CShims.of(tuple(C_SHIMS)) if _state.get("loaded") else {}


class _CShims(dict):
    """{operator overload: [its C declaration]} for `C_SHIMS`' names, pickled as the names and
    declarations: inductor's compile cache keys pickle its config, and an operator overload does not
    pickle (the graphs would bypass the cache and compile in every process); a changed declaration
    changes the key, also in a cache folder of the user's (`compiled.compile_cache_dir`)."""

    @classmethod
    def of(cls, names: tuple[str, ...], declarations: tuple[str, ...] = ()) -> _CShims:
        """The shims of `names`; `declarations` (what the pickle holds besides) are `C_SHIMS`'."""
        return cls({getattr(torch.ops.wedlm_cpu, name.split("::")[1]).default: [C_SHIMS[name]] for name in names})

    def __reduce__(self):
        names = tuple(str(op._schema.name) for op in self)
        return _CShims.of, (names, tuple(C_SHIMS[name] for name in names))


def sources_digest() -> str:
    """sha256 over every file of `csrc/` (name and content), in name order, and the build's flags
    besides the instruction set's (`OPENMP_FLAGS`)."""
    digest = hashlib.sha256(" ".join(OPENMP_FLAGS).encode() + b"\0")
    for path in sorted(CSRC.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _linear_fake(x, weight, bias, panels, packed_key, min_macs, min_rows, few_rows_max):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _bound_linear_fake(x, key, n):
    return x.new_empty((*x.shape[:-1], n))


def _few_rows_mm_fake(x, panels, n, bias):
    return x.new_empty((x.shape[0], n))


def _one_row_mm_fake(x, weight_t):
    return x.new_empty((1, weight_t.shape[1]))


def _one_query_attention_fake(q, k, v, scale, slots=None):
    return q.new_empty(q.shape)


def _row_argmax_fake(logits):
    return logits.new_empty(logits.shape[:1], dtype=torch.long)


def _window_attention_fake(q, k, v, mask, scale, slots=None, key_ends=None):
    # the kernel's output is laid out [B, Lq, Hq, D] and returned as its [B, Hq, Lq, D] transpose
    batch, heads, queries, dim = q.shape
    return q.new_empty((batch, queries, heads, dim)).transpose(1, 2)
