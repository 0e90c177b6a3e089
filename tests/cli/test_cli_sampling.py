"""`wedlm generate` sampling controls and logprobs: the flags reach `SamplingParams` (output equal to
the library's under the same controls), bad values exit 2 naming the field, --logprobs prints them."""

import json

import pytest

from wedlm import SamplingParams
from wedlm.cli.main import main


def args(model, *extra):
    return ["generate", "--model", str(model), "--max-model-len", "256", "--temperature", "0", "Hello there",
            "--max-tokens", "10", "--decoding", "ar", *extra]


def test_controls_and_logprobs_equal_the_library(cli_model, cli_llm, capsys):
    flags = ["--logit-bias", "104:-100, 101:3.5", "--repetition-penalty", "1.3", "--presence-penalty", "0.5",
             "--frequency-penalty", "-0.5", "--min-tokens", "4", "--stop-token-id", "7", "--logprobs", "2", "--json"]
    assert main(args(cli_model, *flags)) == 0
    got = json.loads(capsys.readouterr().out)
    want = cli_llm.generate(["Hello there"], SamplingParams(
        temperature=0, max_tokens=10, decoding="ar", logit_bias={104: -100, 101: 3.5}, repetition_penalty=1.3,
        presence_penalty=0.5, frequency_penalty=-0.5, min_tokens=4, stop_token_ids=[7], logprobs=2))[0]
    plain = cli_llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=10, decoding="ar"))[0]
    assert got["token_ids"] == want["token_ids"] != plain["token_ids"]
    assert [e["logprob"] for e in got["logprobs"]] == [lp.logprob for lp in want["logprobs"]]
    assert [e["top"] for e in got["logprobs"]] == [[list(p) for p in lp.top] for lp in want["logprobs"]]


def test_logprobs_are_printed_after_the_streamed_text(cli_model, cli_llm, capsys):
    assert main(args(cli_model, "--logprobs", "1")) == 0
    captured = capsys.readouterr()
    want = cli_llm.generate(["Hello there"], SamplingParams(temperature=0, max_tokens=10, decoding="ar", logprobs=1))[0]
    lines = [line for line in captured.err.splitlines() if "\ttop: " in line]
    assert len(lines) == len(want["token_ids"])
    for line, lp in zip(lines, want["logprobs"]):
        assert line.split("\t")[1] == f"{lp.logprob:.4f}"


@pytest.mark.parametrize("flag, value, message", [
    ("--repetition-penalty", "0", "repetition_penalty must be a finite number > 0"),
    ("--presence-penalty", "3", "presence_penalty must be a number in [-2, 2]"),
    ("--frequency-penalty", "-2.5", "frequency_penalty must be a number in [-2, 2]"),
    ("--min-p", "1.5", "min_p must be a number in [0, 1]"),
    ("--min-tokens", "11", "min_tokens must be <= max_tokens (10)"),
    ("--logprobs", "21", "logprobs must be an integer in [0, 20]"),
    ("--logit-bias", "5:101", "logit_bias values must be numbers in [-100, 100]"),
    ("--logit-bias", "5=1", "--logit-bias must be ID:BIAS pairs"),
    ("--logit-bias", "x:1", "logit_bias keys must be token ids"),
])
def test_bad_values_exit_2_naming_the_field(cli_model, capsys, flag, value, message):
    assert main(args(cli_model, flag, value)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
