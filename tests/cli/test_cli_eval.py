"""`wedlm eval` decodes with the model's recommended tau and lambda (generation_config.json)
unless the command line says otherwise."""

import json

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
