"""SamplingParams: official defaults, validation messages naming the field, model defaults."""

import pytest

from wedlm.engine.sampling_params import MODEL_DEFAULT, SamplingParams


def test_official_defaults_and_resolution():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.decoding) == (0.2, 1.0, 0, 64, "wedlm")
    assert p.wedlm_entropy_threshold is MODEL_DEFAULT
    r = p.resolve()
    assert (r.wedlm_entropy_threshold, r.wedlm_pos_penalty_factor) == (0.4, 0.02)
    m = p.resolve({"wedlm_entropy_threshold": 0.6, "wedlm_pos_penalty_factor": 0.1})
    assert (m.wedlm_entropy_threshold, m.wedlm_pos_penalty_factor) == (0.6, 0.1)
    explicit = SamplingParams(wedlm_entropy_threshold=None).resolve({"wedlm_entropy_threshold": 0.6})
    assert explicit.wedlm_entropy_threshold is None


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-1), "temperature must be >= 0, got -1"),
    (dict(top_p=0), "top_p must be in (0, 1]"),
    (dict(top_k=-2), "top_k must be an integer >= 0"),
    (dict(max_tokens=0), "max_tokens must be an integer >= 1, got 0"),
    (dict(decoding="beam"), "decoding must be one of"),
    (dict(window_size=0), "window_size must be an integer >= 1"),
    (dict(wedlm_entropy_threshold=-0.1), "wedlm_entropy_threshold must be >= 0"),
    (dict(stop=[""]), "stop must be non-empty strings"),
    (dict(stop_token_ids=[-3]), "stop_token_ids must be non-negative"),
])
def test_bad_values_raise_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        SamplingParams(**kwargs)


def test_stop_string_normalised():
    assert SamplingParams(stop="abc").stop_strings == ["abc"]
    assert SamplingParams(stop=["a", "bc"]).stop_strings == ["a", "bc"]
