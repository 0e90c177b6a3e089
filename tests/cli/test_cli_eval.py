"""`wedlm eval` decodes with the model's recommended tau and lambda (generation_config.json)
unless the command line says otherwise."""

import json

import pytest

from wedlm.cli.eval import decode_configs
from wedlm.cli.main import build_parser


def test_tau_and_lambda_come_from_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"wedlm_entropy_threshold": 0.7, "wedlm_pos_penalty_factor": 0.1}))
    args = build_parser().parse_args(["eval", "--model", str(tmp_path), "--decoding", "wedlm,ar"])
    assert [(c.decoding, c.tau, c.lam) for c in decode_configs(args)] == [("wedlm", 0.7, 0.1), ("ar", 0.7, 0.1)]
    args = build_parser().parse_args(["eval", "--model", str(tmp_path), "--threshold", "0.2", "--penalty", "0"])
    assert [(c.decoding, c.tau, c.lam) for c in decode_configs(args)] == [("ar", 0.2, 0.0), ("wedlm", 0.2, 0.0)]


def test_engine_defaults_without_generation_config(tmp_path):
    args = build_parser().parse_args(["eval", "--model", str(tmp_path)])
    assert [(c.decoding, c.tau, c.lam) for c in decode_configs(args)] == [("ar", 0.4, 0.02), ("wedlm", 0.4, 0.02)]
    args = build_parser().parse_args(["eval", "--model", str(tmp_path), "--tasks", "equation"])
    assert [c.decoding for c in decode_configs(args)] == ["wedlm"]


@pytest.mark.parametrize("decoding, tasks, want", [
    (None, "count,addsub,listops", ["ar", "wedlm"]), (None, "listops", ["ar", "wedlm", "verified"]),
    (None, "gsm8k", ["wedlm"]), ("verified, ar", "count", ["verified", "ar"]),
    ("", "count", None), (" , ", "count", None), ("ar,fast", "count", None),
])
def test_decoding_list_empty_or_unknown_is_a_usage_error(decoding, tasks, want):
    import argparse

    from wedlm.cli.eval import decoders_for
    from wedlm.cli.options import UsageError

    args = argparse.Namespace(decoding=decoding, tasks=tasks)
    if want is not None:
        assert decoders_for(args) == want
    else:
        with pytest.raises(UsageError, match="--decoding: unknown decoder"):
            decoders_for(args)


def test_a_limit_for_a_task_that_does_not_run_is_a_usage_error():
    from wedlm.cli.eval import build_tasks
    from wedlm.cli.options import UsageError

    args = build_parser().parse_args(["eval", "--tasks", "count", "--limit", "addsub=3"])
    with pytest.raises(UsageError, match=r"--limit names addsub, which --tasks does not run \(tasks: count\)"):
        build_tasks(args)
    args = build_parser().parse_args(["eval", "--tasks", "count,addsub", "--limit", "addsub=3"])
    assert [(t.name, len(t.items)) for t in build_tasks(args) if t.name.startswith("addsub")] == [("addsub/add", 3)]
