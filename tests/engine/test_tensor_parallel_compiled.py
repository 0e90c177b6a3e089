"""Tensor parallelism with the compiled forward (`enforce_eager=False`), CPU, gloo, 2 ranks.

Its own module: one tensor-parallel engine per process at a time, and the module-scoped
pairs of test_tensor_parallel.py are torn down when that module ends.
"""

from __future__ import annotations

from test_tensor_parallel import BATCH, DECODERS, ENGINE, QWEN3

from wedlm import LLM, SamplingParams


def test_compiled_two_ranks_give_the_eager_tokens_of_one_process(ckpt_factory):
    """`enforce_eager=False` with tensor_parallel_size=2 (the collectives traced into each
    rank's graph): the same greedy tokens as one eager process for every decoder in one mixed
    batch, rank 0's forward really compiled (at least one graph), and every block free after."""
    path = str(ckpt_factory("tp_qwen3", **QWEN3))
    mixed = [SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, decoding=d,
                            wedlm_entropy_threshold=None if d == "ar" else 5.0) for d in DECODERS]
    prompts = BATCH[:4]
    want = LLM(path, **ENGINE).generate(prompts, mixed)
    with LLM(path, tensor_parallel_size=2, enforce_eager=False, **ENGINE) as tp:
        got = tp.generate(prompts, mixed)
        compiled = tp.engine.runner.compiled
        assert compiled is not None and compiled.graphs >= 1
        assert tp.metrics()["kv_blocks_free"] == 24
    assert [o["token_ids"] for o in got] == [o["token_ids"] for o in want]
