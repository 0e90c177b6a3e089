"""Decoding strategies: ar (reference), wedlm (streaming), blockwise, verified (lossless)."""

from .ar import ARDecoder
from .base import Decoder, StepResult, WindowPlan
from .blockwise import BlockwiseDecoder
from .streaming import StreamingDecoder
from .verified import VerifiedDecoder

DECODER_CLASSES = {cls.name: cls for cls in (ARDecoder, StreamingDecoder, BlockwiseDecoder, VerifiedDecoder)}

__all__ = ["ARDecoder", "BlockwiseDecoder", "DECODER_CLASSES", "Decoder", "StepResult",
           "StreamingDecoder", "VerifiedDecoder", "WindowPlan"]
