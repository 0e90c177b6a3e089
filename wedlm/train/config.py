"""Training-stage configuration: a dataclass read from a YAML file (`wedlm train --config FILE`).

One file describes one stage of the recipe: `stage: ar` (causal next-token
pretraining) or `stage: wedlm` (Dual-Stream Masking + auxiliary AR loss, paper
section 4.2; with chat data this is SFT). Relative paths are resolved against
the current directory, so the recipe runs from the repository root.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

STAGES = ("ar", "wedlm")
ATTENTION = ("chunked", "dense", "flex")


@dataclass(slots=True)
class TrainConfig:
    """All knobs of one training stage. Units: steps are optimizer steps; rows are packed sequences.

    Raises:
        ValueError: an unknown stage/attention, a missing model source, or non-positive sizes.
    """

    stage: str
    data: str
    tokenizer: str
    out_dir: str
    init: str | None = None  # HF checkpoint folder to start from; None = random init from `model`
    model: dict[str, Any] = field(default_factory=dict)  # ModelConfig fields when init is None
    data_format: str = "auto"  # text | chat | auto
    data_limit: int | None = None  # read at most this many records
    data_skip: int = 0  # pass over this many records first (a continued stage reads unseen ones)
    source_limits: dict[str, int] = field(default_factory=dict)  # max records per "source" field
    seq_len: int = 1024  # clean tokens per packed row (L)
    micro_batch: int = 4  # rows per process per micro-batch
    grad_accum: int = 1
    block_size: int = 16  # B of the prediction stream
    ar_weight: float = 1.0  # weight of the auxiliary AR loss (1.0 in the released recipe)
    loss_mix: str = "sum"  # "sum": mask + ar_weight * AR; "mean": (mask + ar_weight * AR) / 2 (official)
    num_learnable_im_end: int = 8  # chat data: scored <|im_end|> tokens after each answer (official default 8)
    end_weight: float = 1.0  # AR loss weight of the first <|im_end|> after an answer (the stop decision); 1 = official
    mask_end_weight: float = 1.0  # mask loss weight of masked slots whose target is <|im_end|>; 1 = official
    first_mask_weight: float = 1.0  # factor on the mask loss of each block's leftmost masked token (slot 0); 1 = official
    suffix_mask_prob: float = 0.0  # share of blocks that mask their last round(gamma*n) tokens; 0 = official
    random_block_offset: bool = False  # shift each document's blocks by o ~ U{0..B-1}; False = official
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 50
    max_steps: int = 1000
    end_step: int | None = None  # finish the stage (final/) at this step; the LR schedule stays that of max_steps
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    init_std: float = 0.02
    seed: int = 0
    save_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    max_minutes: float | None = None  # wall-clock guard: checkpoint, then finish the stage early
    schedule_by_time: bool = False  # cosine over max(step/max_steps, elapsed/max_minutes)
    stop_after_steps: int | None = None  # checkpoint and exit after this many steps in this invocation
    attention: str = "chunked"
    chunk: int = 256
    mixed_precision: str = "auto"  # auto: bf16 on CUDA and on CPUs with bf16 units (AMX/AVX512-BF16), else fp32
    num_threads: int | None = None  # torch CPU threads per process
    compile: bool = False  # torch.compile the model's forward (inductor; dynamic shapes; compiles once per run or resume)

    def __post_init__(self) -> None:
        self._coerce_numbers()
        if self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES}, got {self.stage!r}")
        if self.mixed_precision not in ("auto", "bf16", "no"):
            raise ValueError(f"mixed_precision must be 'auto', 'bf16' or 'no', got {self.mixed_precision!r}")
        if self.loss_mix not in ("sum", "mean"):
            raise ValueError(f"loss_mix must be 'sum' or 'mean', got {self.loss_mix!r}")
        if self.num_learnable_im_end < 0:
            raise ValueError(f"num_learnable_im_end must be >= 0, got {self.num_learnable_im_end}")
        if not self.end_weight > 0:
            raise ValueError(f"end_weight must be > 0, got {self.end_weight}")
        if not self.mask_end_weight > 0:
            raise ValueError(f"mask_end_weight must be > 0, got {self.mask_end_weight}")
        if not self.first_mask_weight > 0:
            raise ValueError(f"first_mask_weight must be > 0, got {self.first_mask_weight}")
        if not 0.0 <= self.suffix_mask_prob <= 1.0:
            raise ValueError(f"suffix_mask_prob must be in [0, 1], got {self.suffix_mask_prob}")
        if self.random_block_offset and self.attention == "flex":
            raise ValueError("random_block_offset needs attention 'chunked' or 'dense' "
                             "(the flex path derives blocks from positions alone)")
        if self.end_step is not None and not 1 <= self.end_step <= self.max_steps:
            raise ValueError(f"end_step must be in 1..max_steps ({self.max_steps}), got {self.end_step}")
        if self.data_skip < 0:
            raise ValueError(f"data_skip must be >= 0, got {self.data_skip}")
        if self.attention not in ATTENTION:
            raise ValueError(f"attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.init is None and not self.model:
            raise ValueError("give either `init` (a checkpoint folder) or `model` (ModelConfig fields)")
        for name in ("seq_len", "micro_batch", "grad_accum", "block_size", "max_steps", "save_every", "chunk",
                     "log_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        self._check_ranges()
        self.betas = tuple(self.betas)

    def _check_ranges(self) -> None:
        """The optimiser and run-length fields: a negative or NaN learning rate trains silently
        wrong, `log_every` 0 divides by zero at the first log, `keep_checkpoints` 0 keeps them all.

        Raises:
            ValueError: naming the field and its range.
        """
        for name in ("lr", "grad_clip", "init_std"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be > 0 and finite, got {getattr(self, name)}")
        for name in ("min_lr", "weight_decay", "ar_weight"):
            if not 0 <= getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be >= 0 and finite, got {getattr(self, name)}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.max_minutes is not None and not 0 < self.max_minutes < math.inf:
            raise ValueError(f"max_minutes must be > 0 and finite (or null), got {self.max_minutes}")
        for name in ("stop_after_steps", "data_limit", "num_threads"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (or null), got {getattr(self, name)}")

    def _coerce_numbers(self) -> None:
        """Read numeric fields given as strings ("5e-4": YAML 1.1, which PyYAML follows, reads an
        exponent without a dot as a string) or as ints where a float is meant.

        Raises:
            ValueError: a numeric field whose value is not a number, naming the field.
        """
        for f in fields(self):
            kind = str(f.type).replace(" | None", "")
            value = getattr(self, f.name)
            if value is None or kind not in ("float", "int", "bool"):
                continue
            if kind == "bool":
                if not isinstance(value, bool):
                    raise ValueError(f"{f.name} must be true or false, got {value!r}")
                continue
            if isinstance(value, bool):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            try:
                number = float(value) if isinstance(value, str) else value
            except ValueError:
                raise ValueError(f"{f.name} must be a number, got {value!r}") from None
            if not isinstance(number, (int, float)):
                raise ValueError(f"{f.name} must be a number, got {value!r}")
            if kind == "int":
                if number != int(number):
                    raise ValueError(f"{f.name} must be a whole number, got {value!r}")
                number = int(number)
            else:
                number = float(number)
            setattr(self, f.name, number)

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["betas"] = list(self.betas)
        return out

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """Read a YAML mapping; `overrides` (e.g. from `--set key=value`) win.

        Raises:
            ValueError: unknown or missing keys (named) or invalid values.
        """
        raw = yaml.safe_load(Path(path).read_text()) or {}
        raw.update(overrides or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown config key(s) {unknown}")
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in raw]
        if missing:
            raise ValueError(f"{path}: missing config key(s) {missing} (or --set KEY=VALUE)")
        return cls(**raw)
