"""wedlm: causal diffusion language models (WeDLM) - parallel decoding under plain causal
attention with a prefix KV cache, training, serving and benchmarks.

`LLM`, `SamplingParams` and `StructuredOutputs` are imported lazily so that `import wedlm` stays cheap.
"""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "StructuredOutputs", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from .engine.llm import LLM
        return LLM
    if name == "SamplingParams":
        from .engine.sampling_params import SamplingParams
        return SamplingParams
    if name == "StructuredOutputs":
        from .engine.structured import StructuredOutputs
        return StructuredOutputs
    raise AttributeError(f"module 'wedlm' has no attribute {name!r}")
