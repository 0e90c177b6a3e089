"""Data for the tiny WeDLM model: synthetic tasks, the stdlib code corpus, the tokenizer.

``python -m wedlm.data.build`` writes every dataset file and the tokenizer; see
``wedlm.data.build`` for the file layout and ``wedlm.data.synthetic`` for the
train / held-out split rule.
"""
