"""Speed benchmarks: WeDLM decoders, AR decoding and transformers `generate` on the
same weights in one run (`wedlm bench`); results as JSON, markdown and plots.
"""
