"""One knob, one name, one check: the WeDLM knobs keep the official names in the library,
generation_config.json and the server; the CLI's long flags are those names and its short
flags are aliases of the same field; a bad value gets the same message from the library
(ValueError), the CLI (exit 2) and the server (400)."""

import json
import shutil

import httpx
import pytest
from tests_serve_util import MODEL_NAME

from wedlm import LLM, SamplingParams
from wedlm.cli.main import build_parser, main
from wedlm.cli.options import sampling_params_from_args
from wedlm.engine.sampling_params import MODEL_DEFAULT

ALIASES = [  # (long flag, short alias, value, SamplingParams field, its value)
    ("--wedlm-entropy-threshold", "--threshold", "0.3", "wedlm_entropy_threshold", 0.3),
    ("--wedlm-pos-penalty-factor", "--penalty", "0.05", "wedlm_pos_penalty_factor", 0.05),
    ("--wedlm-stop-by-ar", "--stop-by-ar", None, "wedlm_stop_by_ar", True),
    ("--wedlm-stop-in-run", "--stop-in-run", None, "wedlm_stop_in_run", True),
]

BAD = [  # (field, CLI flag, bad value, the one message)
    ("wedlm_entropy_threshold", "--wedlm-entropy-threshold", -0.5,
     "wedlm_entropy_threshold must be >= 0 or None, got -0.5"),
    ("wedlm_pos_penalty_factor", "--penalty", -0.5, "wedlm_pos_penalty_factor must be >= 0 and finite, got -0.5"),
    ("wedlm_window_size", "--window-size", 0, "wedlm_window_size must be an integer >= 1, got 0"),
]


def _params(argv: list[str]) -> SamplingParams:
    return sampling_params_from_args(build_parser().parse_args(["generate", "x", *argv]))


@pytest.mark.parametrize("long, short, value, field, expected", ALIASES)
def test_long_flag_and_short_alias_set_the_same_field(long, short, value, field, expected):
    args = [] if value is None else [value]
    by_long, by_short = _params([long, *args]), _params([short, *args])
    assert getattr(by_long, field) == getattr(by_short, field) == expected
    assert getattr(_params([]), field) is MODEL_DEFAULT  # unset: the model's generation_config.json


def test_window_flag_and_alias_set_the_engine_window():
    for flag in ("--wedlm-window-size", "--window-size"):
        assert build_parser().parse_args(["generate", "x", flag, "8"]).window_size == 8


@pytest.mark.parametrize("field, flag, value, message", BAD)
def test_a_bad_value_gets_one_message_everywhere(server, tiny_wedlm, capsys, field, flag, value, message):
    with pytest.raises(ValueError) as lib:
        SamplingParams(**{field: value})
    assert str(lib.value) == message and lib.value.param == field
    if field == "wedlm_window_size":  # the engine's window: LLM checks it with the same function
        with pytest.raises(ValueError) as engine:
            LLM(str(tiny_wedlm), wedlm_window_size=value, device="cpu")
        assert str(engine.value) == message

    assert main(["generate", "--model", str(tiny_wedlm), "x", flag, str(value)]) == 2
    err = capsys.readouterr().err
    assert err == f"wedlm generate: error: {message}\n"

    r = httpx.post(f"{server[0]}/v1/completions", timeout=60,
                   json={"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    assert r.json()["error"]["message"] == f"Invalid value for '{field}': {message}"


def test_generation_config_is_checked_by_the_same_function(tiny_wedlm, tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_wedlm, folder)
    (folder / "generation_config.json").write_text(json.dumps({"wedlm_pos_penalty_factor": -0.5}))
    with pytest.raises(ValueError) as err:
        LLM(str(folder), device="cpu")
    assert str(err.value) == (f"{folder}/generation_config.json: "
                              "wedlm_pos_penalty_factor must be >= 0 and finite, got -0.5")


@pytest.mark.parametrize("argv", [
    ["generate", "x", "--threshold", "-0.5"], ["chat", "--threshold", "-0.5"],
    ["eval", "--wedlm-entropy-threshold", "-0.5"], ["bench", "--taus", "0.4,-0.5"],
])
def test_every_command_refuses_a_bad_threshold_with_the_library_message(tiny_wedlm, capsys, argv):
    try:
        code = main([argv[0], "--model", str(tiny_wedlm), *argv[1:]])
    except SystemExit as exit_:  # refused while parsing the options
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"wedlm {argv[0]}: error: " in err
    assert "wedlm_entropy_threshold must be >= 0 or None, got -0.5\n" in err
