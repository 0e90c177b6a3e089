"""SamplingParams: official defaults, validation messages naming the field, model defaults."""

import re

import pytest

from wedlm.engine.errors import RequestError
from wedlm.engine.sampling_params import MODEL_DEFAULT, SamplingParams


def test_official_defaults_and_resolution():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (0.2, 1.0, 0, 64)
    assert p.wedlm_entropy_threshold is MODEL_DEFAULT and p.decoding is MODEL_DEFAULT
    r = p.resolve()
    assert r.decoding == "wedlm" and p.resolve({"decoding": "ar"}).decoding == "ar"
    assert (r.wedlm_entropy_threshold, r.wedlm_pos_penalty_factor) == (0.4, 0.02)
    m = p.resolve({"wedlm_entropy_threshold": 0.6, "wedlm_pos_penalty_factor": 0.1})
    assert (m.wedlm_entropy_threshold, m.wedlm_pos_penalty_factor) == (0.6, 0.1)
    explicit = SamplingParams(wedlm_entropy_threshold=None).resolve({"wedlm_entropy_threshold": 0.6})
    assert explicit.wedlm_entropy_threshold is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), "temperature must be >= 0 and at most float32's max 3.4028235e38, got -1"),
    (dict(temperature=3.5e38), "temperature must be >= 0 and at most float32's max 3.4028235e38, got 3.5e+38"),
    (dict(temperature=float("inf")), "temperature must be >= 0 and at most float32's max"),
    (dict(top_p=-0.1), "top_p must be in [0, 1], got -0.1"),
    (dict(top_p=1.5), "top_p must be in [0, 1], got 1.5"),
    (dict(top_k=-2), "top_k must be an integer >= 0"),
    (dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    (dict(decoding="beam"), "decoding must be one of"),
    (dict(wedlm_window_size=0), "wedlm_window_size must be an integer >= 1"),
    (dict(wedlm_entropy_threshold=-0.1), "wedlm_entropy_threshold must be >= 0"),
    (dict(stop=[""]), "stop must be non-empty strings"),
    (dict(stop_token_ids=[-3]), "stop_token_ids must be non-negative"),
])
def test_bad_values_raise_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SamplingParams(**kwargs)


def test_stop_string_normalised():
    assert SamplingParams(stop="abc").stop_strings == ["abc"]
    assert SamplingParams(stop=["a", "bc"]).stop_strings == ["a", "bc"]


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature="0.5"), "temperature"), (dict(temperature=None), "temperature"),
    (dict(temperature=float("inf")), "temperature"), (dict(temperature=True), "temperature"),
    (dict(top_p=True), "top_p"), (dict(top_p="1"), "top_p"),
    (dict(top_k=True), "top_k"), (dict(top_k=2.0), "top_k"),
    (dict(max_tokens=True), "max_tokens"), (dict(max_tokens="8"), "max_tokens"),
    (dict(wedlm_window_size=True), "wedlm_window_size"), (dict(wedlm_window_size=2.5), "wedlm_window_size"),
    (dict(wedlm_entropy_threshold="x"), "wedlm_entropy_threshold"),
    (dict(wedlm_entropy_threshold=True), "wedlm_entropy_threshold"),
    (dict(wedlm_entropy_threshold=float("nan")), "wedlm_entropy_threshold"),
    (dict(wedlm_pos_penalty_factor=None), "wedlm_pos_penalty_factor"),
    (dict(wedlm_pos_penalty_factor=float("inf")), "wedlm_pos_penalty_factor"),
    (dict(wedlm_pos_penalty_factor=float("nan")), "wedlm_pos_penalty_factor"),
    (dict(seed=1.5), "seed"), (dict(seed="1"), "seed"), (dict(seed=True), "seed"),
    (dict(ignore_eos="no"), "ignore_eos"),
    (dict(stop=5), "stop"), (dict(stop={"a": 1}), "stop"),
    (dict(stop_token_ids=5), "stop_token_ids"), (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(decoding=["ar"]), "decoding"), (dict(wedlm_fallback=None), "wedlm_fallback"),
])
def test_wrong_types_raise_value_error_naming_the_field(kwargs, field):
    """Wrong types, bools for numbers and non-finite values are RequestErrors (ValueErrors whose
    `param` is the field), never TypeErrors."""
    with pytest.raises(RequestError, match=f"^{field} must be") as info:
        SamplingParams(**kwargs)
    assert isinstance(info.value, ValueError) and info.value.param == field


def test_top_p_zero_is_greedy_and_keeps_only_the_top_token():
    import torch

    from wedlm.engine.sampling import _top_p

    assert SamplingParams(temperature=1.0, top_p=0).greedy and not SamplingParams(temperature=1.0).greedy
    probs = torch.tensor([[0.1, 0.6, 0.3], [0.5, 0.2, 0.3]])
    assert _top_p(probs, 0.0).tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]
    kept = _top_p(probs, 0.65)
    assert torch.allclose(kept, torch.tensor([[0.0, 2 / 3, 1 / 3], [0.625, 0.0, 0.375]]))


def test_numbers_are_normalised():
    import numpy as np

    p = SamplingParams(temperature=1, top_p=np.float32(0.5), top_k=np.int64(3), max_tokens=np.int64(7),
                       seed=2 ** 70, stop_token_ids=(np.int64(5),), wedlm_entropy_threshold=float("inf"))
    assert (type(p.temperature), type(p.top_k), type(p.max_tokens)) == (float, int, int)
    assert p.stop_token_ids == [5] and p.wedlm_entropy_threshold == float("inf") and p.seed == 2 ** 70


def test_model_defaults_are_validated():
    with pytest.raises(ValueError, match="wedlm_pos_penalty_factor must be"):
        SamplingParams().resolve({"wedlm_pos_penalty_factor": -1})
