"""benchmarks/step_profile.py's floor (FLOPs and bytes of a step, the recorded shapes, the floor rows)
and its host work (the step less its forward calls, and with the forward replayed)."""

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _profile_module():
    spec = importlib.util.spec_from_file_location("step_profile", REPO / "benchmarks" / "step_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_cost_of_the_shipped_shape():
    """A 16-token window on 100 cached rows of the shipped model's shape, counted by hand: per layer
    192 x (192 + 2 x 96) + 192 x 192 + 192 x 1024 + 512 x 192 = 405,504 weights."""
    from wedlm.model import ModelConfig

    config = ModelConfig.from_dict(json.loads((REPO / "models" / "wedlm-tiny" / "config.json").read_text()))
    keys = 16 * 100 + 16 * 17 // 2  # query i of the window reads 100 + i + 1 keys
    flops, nbytes = _profile_module().step_cost(config, tokens=16, rows=16, keys=keys, kv_rows=116)
    assert flops == 2 * (16 * 8 * 405_504 + 8 * 2 * keys * 192 + 16 * 192 * 4096) == 139_640_832
    assert nbytes == 4 * (8 * 405_504 + 4096 * 192) + 4 * 2 * 8 * 96 * 116 == 16_834_560


def test_recorded_shapes_and_floor_rows(capsys):
    from wedlm.engine.runner import ForwardItem

    module = _profile_module()

    class Runner:
        def prepare(self, items):
            return len(items)

    runner = Runner()
    shapes = module._record_shapes(runner)
    items = [ForwardItem([1] * 4, [0, 1, 2, 3], [0], 10, [0, 1]), ForwardItem([2] * 2, [5, 6], [1], 0, [1])]
    assert runner.prepare(items) == 2
    # tokens 6, rows 3, keys 4 x 10 + 10 and 0 + 3, cache rows 14 + 2
    assert shapes == [(6, 3, 53, 16)]
    cell = {"forwards per step": 1.0, "MFLOP": 2.0, "MB read": 1.0, "peak GFLOP/s": 1.0, "peak GB/s": 2.0,
            "step wall, no profiler": 4000.0, "step wall, median of runs": 5000.0,
            "execute (forward + logits)": 3000.0}
    module.print_floor([cell])
    out = capsys.readouterr().out
    # floor = max(2 MFLOP / 1 GFLOP/s, 1 MB / 2 GB/s) = 2,000 us
    assert "| floor: max(FLOP/peak, bytes/bandwidth) | 2000 |" in out
    assert "| step wall, x floor | 2.00x |" in out and "| execute (forward + logits), x floor | 1.50x |" in out
    assert "| step wall (median of runs), x floor | 2.50x |" in out


def test_host_work_with_the_forward_timed_and_replayed(tiny_wedlm):
    """The host-work split on a tiny random checkpoint (eager): the replayed run gives the recorded
    answers, both figures are per-step microseconds, and the runner's forward is put back."""
    from wedlm import LLM, SamplingParams
    from wedlm.engine import runner as runner_module

    module = _profile_module()
    llm = LLM(str(tiny_wedlm), enforce_eager=True, enable_prefix_caching=False)
    before = runner_module.forward_logits
    params = SamplingParams(temperature=0.0, max_tokens=12, decoding="wedlm", ignore_eos=True)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    _, _, expected = module._run(llm, prompts, params)
    timed = module._TimedForward(llm.engine.runner)
    with timed:
        _, _, answers = module._run(llm, prompts, params)
    assert answers == expected and timed.seconds > 0  # the real forward ran, timed
    steps, seconds, _ = module._run(llm, prompts, params)
    host = module._host_work(llm, prompts, params, runs=2)
    assert runner_module.forward_logits is before and llm.engine.runner.compiled is None
    assert 0 < host["host work, forward replayed"] < 1e6 and 0 < host["host work"] < 1e6
    # the forward calls are taken out: well under a whole step (the forward is most of an eager one)
    assert host["host work"] < 0.9 * 1e6 * seconds / steps
    with timed:  # a replay that runs out fails its requests' forward: no answer, as the engine fails one
        timed.replay = []
        _, _, answers = module._run(llm, prompts, params)
    assert answers == [[], []] and runner_module.forward_logits is before


def test_host_work_rows(capsys):
    module = _profile_module()
    module.print_host_work([{"host work": 250.4, "host work, forward replayed": 148.0},
                            {"host work": 300.0, "host work, forward replayed": None}])
    out = capsys.readouterr().out
    assert "| host work (step less its forward calls) | 250 | 300 |" in out
    assert "| host work, forward replayed (warm caches) | 148 | - |" in out
    assert module._pooled([3.0, 1.0], min) == 1.0 and module._pooled([3.0, None], min) is None
