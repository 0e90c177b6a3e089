"""Engine configuration and the sizes derived from it.

`EngineConfig` is what `LLM(...)` parses its keyword arguments into. Sizes
that depend on the model (context length, KV block count) are derived by
`resolve_*` functions and returned, never written back into the config.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

import torch

from ..hardware import compile_toolchain, cpu_has_bf16_units, cpu_prefers_onednn_linear
from ..model import QwenForCausalLM
from .defaults import check_knob
from .fast_model import bf16_panels_refusal, bf16_panels_supported, use_native_ops
from .quantize import check_quantization

DEFAULT_MAX_MODEL_LEN = 4096
CPU_KV_BUDGET_BYTES = 4 << 30
# Automatic CPU autocast starts at this hidden size. Measured on a 2-core AMX Xeon (docs/experiments.md,
# "Precision on a CPU with AMX"): at hidden 192 fp32 was as fast per forward and engine `ar` ran
# 1.2-1.9x transformers in fp32 against 0.7-1.3x under bf16; at hidden 512 and 1024 bf16 was as
# fast at one slot and 1.7-2.3x faster at 16 slots.
AUTOCAST_MIN_HIDDEN = 512


@dataclass(slots=True)
class EngineConfig:
    """Engine settings.

    Attributes:
        model: checkpoint folder.
        window_size: WeDLM window W (`LLM`'s `wedlm_window_size`); None = generation_config.json's
            `wedlm_window_size`, else `defaults.DEFAULT_WINDOW`.
        max_model_len: context limit (prompt + output); None = min(4096,
            max_position_embeddings).
        max_num_seqs: most concurrent running requests.
        max_num_batched_tokens: most tokens in one forward; None = max(max_model_len, 4W + 2).
        kv_block_size: rows per KV block (small blocks make prefix sharing useful).
        num_kv_blocks: KV blocks; None = enough for max_num_seqs full-length
            requests within the memory budget.
        device: "cpu", "cuda", "cuda:1"; None = cuda when available.
        dtype: float32 / bfloat16 / float16; None = bfloat16 on cuda, float32 on cpu.
        enable_prefix_caching: reuse full committed blocks across requests.
        gpu_memory_utilization: fraction of free GPU memory the KV cache may take.
        seed: seeds the per-request RNGs of requests without their own seed.
        fast_path: fused RMSNorm / QKV / gate-up modules (same logits, fewer ops).
        tensor_parallel_size: ranks the weights are split across (`wedlm.engine.parallel`);
            rank r runs on cuda:r (from `device`'s index) or on the CPU.
        enforce_eager: True runs the forward eagerly (the reference path); False = the
            `torch.compile`d forward on shape buckets, plus CUDA graphs of decode steps on CUDA
            (`compiled.py`); None = automatic (`resolve_enforce_eager`: compiled wherever
            inductor can build kernels, with compiled graphs cached on disk across processes).
        autocast: bf16 autocast of float32 weights. None = automatic: on for a CPU with
            native bf16 matrix units (AMX / AVX512-BF16, `wedlm.hardware.cpu_has_bf16_units`)
            and a model of hidden size >= AUTOCAST_MIN_HIDDEN (512), off otherwise; True forces
            it, False turns it off.
        quantization: None (float weights), "int8": every matmul runs int8 activations (per
            row) x int8 weights (per output channel) on the CPU (`quantize.py`), or "bf16": every
            matmul reads its weights rounded to bf16 and keeps float32 activations and outputs
            (`fast_model.bf16_weight_linear`; a CPU with AVX512-BF16); both need float32 weights,
            one process, no autocast.
        verified_token_budget: rows a forward may spend on `verified` windows before they shrink
            (`decoders/verified.py`, `window_for_load`); None = `defaults.VERIFIED_TOKEN_BUDGET`.
    """

    model: str
    window_size: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    kv_block_size: int = 16
    num_kv_blocks: int | None = None
    device: str | None = None
    dtype: str | None = None
    enable_prefix_caching: bool = True
    gpu_memory_utilization: float = 0.9
    seed: int = 0
    fast_path: bool = True
    tensor_parallel_size: int = 1
    enforce_eager: bool | None = None
    autocast: bool | None = None
    quantization: str | None = None
    verified_token_budget: int | None = None

    def __post_init__(self) -> None:
        required = ("max_num_seqs", "kv_block_size", "tensor_parallel_size")
        if self.window_size is not None:  # LLM's wedlm_window_size
            self.window_size = check_knob("wedlm_window_size", self.window_size)
        for name in required + ("max_model_len", "max_num_batched_tokens", "num_kv_blocks", "verified_token_budget"):
            value = getattr(self, name)
            if value is None and name not in required:
                continue
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
            setattr(self, name, int(value))
        if not isinstance(self.gpu_memory_utilization, numbers.Real) or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.enforce_eager is not None and not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be None (automatic), True or False, got {self.enforce_eager!r}")
        if self.autocast is not None and not isinstance(self.autocast, bool):
            raise ValueError(f"autocast must be None (automatic), True or False, got {self.autocast!r}")
        if self.tensor_parallel_size > 1 and self.autocast:
            raise ValueError("autocast=True is not supported with "
                             f"tensor_parallel_size={self.tensor_parallel_size}; use autocast=None or False")
        self.quantization = check_quantization(self.quantization)
        if self.quantization and (self.tensor_parallel_size > 1 or self.autocast):
            raise ValueError(f"quantization={self.quantization!r} runs in one process without autocast, got "
                             f"tensor_parallel_size={self.tensor_parallel_size}, autocast={self.autocast}")


def resolve_dtype(dtype: str | None, device: torch.device) -> str:
    """The weights' dtype of an engine: `dtype`, or by default bfloat16 on CUDA, float32 elsewhere."""
    return dtype or ("bfloat16" if device.type == "cuda" else "float32")


def resolve_device(device: str | None) -> torch.device:
    """The torch device for `device` (None: cuda when available, else cpu).

    Raises:
        ValueError: a malformed name, or a device this torch build or machine does not have,
            naming it and the devices that are available.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device {device!r} is not a device name; available: {', '.join(available_devices())}") \
            from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        why = "the engine runs on cpu or cuda"
    elif not torch.cuda.is_available():
        why = f"torch {torch.__version__} " + ("has no CUDA build" if torch.version.cuda is None else "sees no CUDA GPU")
    elif (resolved.index or 0) >= torch.cuda.device_count():
        why = f"this machine has {torch.cuda.device_count()} CUDA device(s)"
    else:
        return resolved
    raise ValueError(f"device {device!r} is not available ({why}); available: {', '.join(available_devices())}")


def available_devices() -> list[str]:
    """The device names this process can run on: cpu, then cuda:0 .. cuda:N-1."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cpu", *(f"cuda:{i}" for i in range(count))]


def resolve_precision(requested: bool | None, device: torch.device, dtype: str, flags: set[str] | None = None,
                      hidden_size: int | None = None) -> tuple[torch.dtype | None, str]:
    """(autocast dtype, what the forward computes in and why) for float32 or low-precision weights.

    `requested` None picks bf16 for float32 weights on a CPU with native bf16 matrix units
    (`flags`: /proc/cpuinfo's by default) when the model's `hidden_size` is at least
    AUTOCAST_MIN_HIDDEN (512; None = size unknown, counts as large), else None; True forces
    bf16; False gives None. The line is for logs and reports, e.g. "float32 weights, bf16
    autocast (auto: CPU has bf16 matrix units)" or "float32 weights, no autocast (auto: hidden
    size 192 < 512, fp32 is as fast)".

    Raises:
        ValueError: autocast=True with weights that are not float32 (names the dtype).
    """
    autocast, why = _autocast_choice(requested, device, dtype, flags, hidden_size)
    return autocast, f"{dtype} weights, {'bf16 autocast' if autocast is not None else 'no autocast'} ({why})"


def _autocast_choice(requested, device, dtype, flags, hidden_size) -> tuple[torch.dtype | None, str]:
    if requested is False:
        return None, "off"
    if dtype != "float32":
        if requested:
            raise ValueError(f"autocast=True needs float32 weights, got dtype={dtype!r}")
        return None, "off"
    if requested:
        return torch.bfloat16, "forced"
    if device.type != "cpu" or not cpu_has_bf16_units(flags):
        return None, "auto: no bf16 matrix units"
    if hidden_size is not None and hidden_size < AUTOCAST_MIN_HIDDEN:
        return None, f"auto: hidden size {hidden_size} < {AUTOCAST_MIN_HIDDEN}, fp32 is as fast"
    return torch.bfloat16, "auto: CPU has bf16 matrix units"


def auto_bf16_weights(config: EngineConfig, autocast: torch.dtype | None, model: QwenForCausalLM) -> bool:
    """Whether the automatic bf16 choice (`resolve_precision` picked bf16 autocast with
    `config.autocast` None) runs as bf16 weights with float32 activations instead
    (`quantization="bf16"`, `fast_model.bf16_weight_linear`): on a CPU whose C++ operators multiply
    bf16 panels (AVX512-BF16; loads them, building them once per machine if need be), in one process
    on the fast path, for a model whose matmuls take bf16 panels (`fast_model.bf16_panels_refusal`;
    autocast otherwise). Both read the same bf16 weights at the same speed; autocast also rounds every
    matmul's output to bf16, so its greedy answers part from float32's sooner
    (docs/engine.md, "bf16 weights on the CPU")."""
    if (autocast is None or config.autocast is not None or config.quantization
            or config.tensor_parallel_size > 1 or not config.fast_path):
        return False
    return bf16_panels_refusal(model) is None and use_native_ops() and bf16_panels_supported()


def resolve_enforce_eager(requested: bool | None, device: torch.device) -> tuple[bool, str]:
    """(run the forward eagerly, why: the line for logs) for the engine option `enforce_eager`.

    None is automatic: the compiled forward (False) wherever torch's inductor can build kernels
    for `device` (`hardware.compile_toolchain`: a C++ compiler on a CPU, Triton on CUDA), else
    eager. The compiled step is the faster one on every device measured (shipped model, one CPU
    thread, batch-1 `wedlm`: eager took 1.44x the compiled step's time), and the generated kernels
    are cached on disk (`compiled.compile_cache_dir`), so a later process pays the model's trace
    (seconds), not the whole compile (docs/engine.md, "Compiled forward": a short one-off run is
    faster with True). The environment variable WEDLM_ENFORCE_EAGER ("0" or
    "1") overrides the automatic choice (the test suite sets "1": only the tests of the compiled
    forward compile); an explicit True or False wins over both.

    Raises:
        ValueError: WEDLM_ENFORCE_EAGER set to anything but "0" or "1".
    """
    if requested is not None:
        return requested, "requested"
    env = os.environ.get("WEDLM_ENFORCE_EAGER")
    if env is not None and env not in ("0", "1"):
        raise ValueError(f"WEDLM_ENFORCE_EAGER must be '0' or '1', got {env!r}")
    if env is not None:
        return env == "1", f"WEDLM_ENFORCE_EAGER={env}"
    ok, why = compile_toolchain(device.type)
    return not ok, f"auto: {why}"


def resolve_cpu_linear(device: torch.device, dtype: str, autocast: torch.dtype | None,
                       tensor_parallel_size: int = 1) -> tuple[bool, str]:
    """(float32 matmuls by oneDNN on prepacked weights, `fast_model.use_onednn_linear`; the line for logs).

    Only for float32 weights without autocast on a CPU, in one process (tensor-parallel ranks
    keep BLAS), where `hardware.cpu_prefers_onednn_linear` says BLAS is the slower kernel.

    Raises:
        ValueError: WEDLM_CPU_LINEAR set to anything but "onednn" or "blas".
    """
    if device.type != "cpu" or dtype != "float32" or autocast is not None or tensor_parallel_size > 1:
        return False, "BLAS matmuls"
    onednn, why = cpu_prefers_onednn_linear()
    return onednn, f"{'oneDNN float32 matmuls on prepacked weights' if onednn else 'BLAS float32 matmuls'} ({why})"


def resolve_max_model_len(requested: int | None, max_position_embeddings: int) -> int:
    """Context limit; raises ValueError if above the model's max_position_embeddings."""
    if requested is None:
        return min(DEFAULT_MAX_MODEL_LEN, max_position_embeddings)
    if requested > max_position_embeddings:
        raise ValueError(f"max_model_len={requested} exceeds the model's "
                         f"max_position_embeddings={max_position_embeddings}")
    return requested


def resolve_num_blocks(config: EngineConfig, max_model_len: int, bytes_per_block: int,
                       device: torch.device) -> int:
    """KV blocks: the requested count, or max_num_seqs full requests capped by memory.

    An explicit `num_kv_blocks` is honoured as given (requests that could never
    fit are then refused one by one at `add_request`).

    Raises:
        ValueError: the memory budget holds fewer blocks than one max_model_len request needs.
    """
    per_seq = -(-max_model_len // config.kv_block_size)
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    else:
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            budget = int(free * config.gpu_memory_utilization)
        else:
            budget = CPU_KV_BUDGET_BYTES
        blocks = min(config.max_num_seqs * per_seq, max(1, budget // bytes_per_block))
    if blocks < per_seq:
        raise ValueError(f"num_kv_blocks={blocks} cannot hold one request of max_model_len={max_model_len} "
                         f"(needs {per_seq} blocks of {config.kv_block_size})")
    return blocks
