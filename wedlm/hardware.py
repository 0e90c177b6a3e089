"""What the CPU can do fast: native bf16 matrix units decide between bf16 autocast and fp32.

Why: on a CPU with AMX tiles or AVX512-BF16 a bf16 matmul runs several times faster than
fp32 (8x for a 4096x192x512 product on one AMX machine here); on an AVX2-only CPU bf16 is
emulated and slower than fp32. Training (`mixed_precision: auto`) and the engine choose
from this and report the path that ran.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from pathlib import Path

BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# int8 dot-product instructions (AMX tiles, AVX512-VNNI, AVX-VNNI), which torch's int8 matmul needs
# to run fast: without them `torch._int_mm` took 4.9 ms for [16, 192] x [192, 1024] on a Zen 3
# core, 31x the float32 product
INT8_FLAGS = ("amx_int8", "avx512_vnni", "avx_vnni")


def _cpuinfo_field(key: str, cpuinfo: str | None = None) -> str | None:
    """The value of the first `key` line of /proc/cpuinfo (or of `cpuinfo`); None where there is none."""
    if cpuinfo is None:
        cpuinfo = _proc_cpuinfo()
        if cpuinfo is None:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


@functools.lru_cache(maxsize=1)
def _proc_cpuinfo() -> str | None:
    """/proc/cpuinfo's text, read once a process (a model's load asks for the flags once per layer;
    the file of a many-core machine is large); None where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (Linux) or `platform.processor()`."""
    name = _cpuinfo_field("model name")
    return name if name is not None else platform.processor() or platform.machine()


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The `vendor_id` of the first processor in /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"; "" where
    none)."""
    return _cpuinfo_field("vendor_id", cpuinfo) or ""


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The `flags` of the first processor in /proc/cpuinfo (empty set where there is none)."""
    return set((_cpuinfo_field("flags", cpuinfo) or "").split())


def cpu_has_bf16_units(flags: set[str] | None = None) -> bool:
    """True when the CPU has native bf16 matrix instructions (AMX-BF16 or AVX512-BF16).

    Without `flags`, the environment variable WEDLM_CPU_BF16 ("0" or "1") overrides the
    detection from /proc/cpuinfo: "0" keeps every automatic choice (engine autocast, training
    `mixed_precision: auto`) in float32, e.g. for bit-exact comparisons (the test suite sets it).

    Raises:
        ValueError: WEDLM_CPU_BF16 set to anything but "0" or "1".
    """
    if flags is None:
        env = os.environ.get("WEDLM_CPU_BF16")
        if env is not None and env not in ("0", "1"):
            raise ValueError(f"WEDLM_CPU_BF16 must be '0' or '1', got {env!r}")
        if env is not None:
            return env == "1"
        flags = cpu_flags()
    return any(f in flags for f in BF16_FLAGS)


def cpu_is_x86(machine: str | None = None) -> bool:
    """True on an x86-64 machine (`machine`, default `platform.machine()`), whose /proc/cpuinfo
    flags name its vector instruction sets."""
    return (platform.machine() if machine is None else machine).lower() in ("x86_64", "amd64")


def cpu_has_int8_units(flags: set[str] | None = None) -> bool:
    """True when the CPU has int8 dot-product instructions (`INT8_FLAGS`), or is not an x86 CPU
    (where /proc/cpuinfo names no such flags: torch's own kernels are left to decide)."""
    if flags is None:
        if not cpu_is_x86():
            return True
        flags = cpu_flags()
    return any(f in flags for f in INT8_FLAGS)


def training_precision(requested: str, cuda: bool, flags: set[str] | None = None) -> str:
    """The accelerate mixed-precision mode to run: "bf16" or "no".

    `requested` "auto" picks bf16 on CUDA and on CPUs with bf16 units, else "no" (fp32);
    "bf16" and "no" are taken as given.

    Raises:
        ValueError: any other value.
    """
    if requested not in ("auto", "bf16", "no"):
        raise ValueError(f"mixed_precision must be 'auto', 'bf16' or 'no', got {requested!r}")
    if requested != "auto":
        return requested
    return "bf16" if cuda or cpu_has_bf16_units(flags) else "no"


def cpu_prefers_onednn_linear(vendor: str | None = None, flags: set[str] | None = None) -> tuple[bool, str]:
    """(route float32 matmuls through oneDNN instead of BLAS, why) for this CPU.

    Why: torch's CPU build multiplies float32 matrices with MKL, whose fast kernels target Intel
    CPUs; on an AMD Zen 4 core (AVX-512) MKL ran [32, 192] x [192, 1024] in 142 us against 82 us
    for oneDNN, and [544, 192] x [192, 4096] in 8.7 ms against 3.8 ms (docs/engine.md, "oneDNN
    matmuls"). Automatic: True for an AMD CPU with AVX-512 (where it was measured), False
    otherwise (Intel: MKL's own target, not measured; AVX2-only AMD: on a Zen 3 core the
    engine's oneDNN rule ran the shipped model's matmuls at 0.91-0.97x MKL's speed from 8 rows,
    docs/experiments.md "An AVX2-only AMD CPU"). Without `vendor` and
    `flags`, WEDLM_CPU_LINEAR ("onednn" or "blas") overrides the detection (the test suite sets
    "blas", like WEDLM_CPU_BF16).

    Raises:
        ValueError: WEDLM_CPU_LINEAR set to anything but "onednn" or "blas".
    """
    if vendor is None and flags is None:
        env = os.environ.get("WEDLM_CPU_LINEAR")
        if env is not None and env not in ("onednn", "blas"):
            raise ValueError(f"WEDLM_CPU_LINEAR must be 'onednn' or 'blas', got {env!r}")
        if env is not None:
            return env == "onednn", f"WEDLM_CPU_LINEAR={env}"
    vendor = cpu_vendor() if vendor is None else vendor
    flags = cpu_flags() if flags is None else flags
    if vendor == "AuthenticAMD" and "avx512f" in flags:
        return True, "auto: AMD CPU with AVX-512, where MKL is slow"
    return False, "auto: BLAS" if vendor != "AuthenticAMD" else "auto: AMD CPU without AVX-512, where MKL is faster"


def compile_toolchain(device_type: str) -> tuple[bool, str]:
    """(torch.compile's inductor can build kernels for `device_type` here, why).

    Inductor compiles a CPU graph to C++ with the system's C++ compiler (`g++`, or $CXX /
    torch's `cpp.cxx` setting; `cl` on Windows) and a CUDA graph to Triton kernels; without
    that tool a compiled forward fails at its first call, so the engine's automatic choice
    (`engine.config.resolve_enforce_eager`) stays eager. Other device types: False.
    """
    if device_type == "cuda":
        from torch.utils._triton import has_triton

        return (True, "Triton found") if has_triton() else (False, "no Triton for CUDA kernels")
    if device_type != "cpu":
        return False, f"no inductor backend for {device_type}"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return True, f"C++ compiler {get_cpp_compiler()}"
    except Exception as err:  # inductor raises its own InvalidCxxCompiler (or OSError) when none works
        return False, f"no C++ compiler for inductor ({type(err).__name__})"


# allocators that replace glibc's malloc when preloaded, by the start of their library's file name
ALLOCATORS = (("libtcmalloc", "tcmalloc"), ("libjemalloc", "jemalloc"), ("libmimalloc", "mimalloc"))


def process_allocator(library: str | None = None) -> str:
    """The malloc this process calls: "tcmalloc", "jemalloc" or "mimalloc" where `malloc` resolves to
    such a library (preloaded with `LD_PRELOAD`; one loaded later by dlopen does not replace it),
    else "glibc" on Linux, "system" elsewhere. `library`: the path of the shared object that
    defines `malloc` (default: this process's, from the dynamic linker's `dladdr`).

    Why it matters: a compiled CPU step makes a few hundred small allocations in cold caches, and
    a preloaded TCMalloc runs the shipped model's batch-1 `wedlm` step faster (docs/engine.md,
    "The memory allocator"); the engine's start log and the benchmark reports name it.
    """
    name = os.path.basename((_malloc_library() if library is None else library) or "")
    for prefix, allocator in ALLOCATORS:
        if name.startswith(prefix):
            return allocator
    return "glibc" if sys.platform.startswith("linux") else "system"


@functools.lru_cache(maxsize=1)
def _malloc_library() -> str | None:
    """The file of the shared object `malloc` resolves to in this process, or None where the
    dynamic linker cannot say (no `dladdr`, a static build). Asked once: a process keeps the
    malloc it started with."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                    ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]

    try:
        process = ctypes.CDLL(None)
        dladdr = getattr(process, "dladdr", None) or ctypes.CDLL("libdl.so.2").dladdr
        info = DlInfo()
        if not dladdr(ctypes.cast(process.malloc, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
            return None
        return os.fsdecode(info.dli_fname)
    except (OSError, AttributeError):
        return None
