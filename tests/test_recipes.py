"""The tiny model's recipe helpers: the decoding-defaults pick of recipes/tune_decoding.py."""

import pytest

from recipes.tune_decoding import pick


def _row(tau, tpf, worst, slack=0.005):
    return {"tau": tau, "tokens_per_forward": tpf, "worst_loss": worst, "ok": worst <= slack}


def test_pick_fastest_within_slack_else_closest_to_ar():
    grid = [_row(0.1, 2.0, 0.0), _row(0.4, 4.0, 0.004), _row(0.6, 6.0, 0.05)]
    best, rule = pick(grid)
    assert (best["tau"], rule) == (0.4, "within slack")  # 0.6 is faster but loses 5 points
    # ties in tokens/forward go to the lower tau
    assert pick([_row(0.4, 4.0, 0.0), _row(0.2, 4.0, 0.0)])[0]["tau"] == 0.2
    # nothing within slack: the smallest worst-task loss, then the faster one
    grid = [_row(0.1, 2.0, 0.03), _row(0.2, 3.0, 0.02), _row(0.4, 5.0, 0.02), _row(0.6, 6.0, 0.10)]
    best, rule = pick(grid)
    assert (best["tau"], rule) == (0.4, "closest to AR")
    with pytest.raises(ValueError, match="empty grid"):
        pick([])
