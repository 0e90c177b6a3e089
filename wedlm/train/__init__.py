"""WeDLM training: dual-stream batches (masking, packing), losses, and the accelerate trainer."""

from .config import TrainConfig
from .masking import DualStreamExample, MaskDraw, build_causal, build_dual_stream, collate, draw_masks
from .packing import Document, PackedRow, Packer

__all__ = ["Document", "DualStreamExample", "MaskDraw", "PackedRow", "Packer", "TrainConfig",
           "build_causal", "build_dual_stream", "collate", "draw_masks"]
