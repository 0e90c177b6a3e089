"""Inference engine: paged KV cache with prefix caching, continuous batching and the
WeDLM decoders (streaming, ar, blockwise, verified). `LLM` is the public facade."""
