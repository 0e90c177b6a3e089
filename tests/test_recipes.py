"""The tiny model's recipe helpers: the decoding-defaults pick of recipes/tune_decoding.py, the
check items, the learning-rate sweep's arms and report."""

import json

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
    # with a tie margin, a loss one item (here 1/60) above the smallest counts as equal: the faster wins
    grid = [_row(0.2, 2.0, 4 / 60), _row(0.1, 4.45, 5 / 60), _row(0.2, 6.9, 9 / 60)]
    assert pick(grid)[0]["tokens_per_forward"] == 2.0
    assert pick(grid, tie=1 / 60)[0]["tokens_per_forward"] == 4.45
    assert pick(grid, tie=5 / 60)[0]["tokens_per_forward"] == 6.9
    with pytest.raises(ValueError, match="empty grid"):
        pick([])


def test_check_items_come_from_the_validation_split_with_the_asked_terms():
    from recipes.check_wedlm_tiny import count_band, short_up
    from wedlm.data.curriculum import split_of

    band = count_band(7, 20, 30)
    assert len(band) == 30
    for ex in band:
        terms = ex["answer"].split(", ")
        assert 7 <= len(terms) <= 20
        nums = [int(x) for x in terms]
        down = ex["prompt"].startswith("Count down")
        low, high = (nums[-1], nums[0]) if down else (nums[0], nums[-1])
        step = abs(nums[1] - nums[0])
        assert split_of(f"count:{low}:{high}:{step}" + (":down" if down else "")) == "val"
    assert {ex["prompt"].startswith("Count down") for ex in band} == {True, False}
    ups = short_up(40)
    assert all(ex["prompt"].startswith("Count from ") and 1 <= len(ex["answer"].split(", ")) <= 15 for ex in ups)
    assert all(split_of(f"count:{ex['answer'].split(', ')[0]}:{ex['answer'].split(', ')[-1]}:1") == "val"
               for ex in ups)
    with pytest.raises(ValueError, match="band"):
        count_band(5, 4, 1)


def test_count_miss_names_the_last_digit_shortcut():
    from recipes.check_wedlm_tiny import count_miss

    ex = {"answer": "544, 545, 546, 547, 548, 549, 550, 551, 552, 553, 554, 555, 556, 557, 558, 559, 560, 561"}

    def rec(text, stopped=True):
        return {"right": text == ex["answer"], "stopped": stopped, "text": text}

    assert count_miss(ex, rec(ex["answer"])) is None
    assert count_miss(ex, rec("544, 545, 546, 547, 548, 549, 550, 551")) == "early at B's last digit"
    assert count_miss(ex, rec("544, 545, 546")) == "early"
    assert count_miss(ex, rec(ex["answer"] + ", 562", stopped=False)) == "runaway"
    assert count_miss(ex, rec(ex["answer"] + ", 562")) == "late"
    assert count_miss(ex, rec("544, 545, 547" + ex["answer"][13:] + ", 562")) == "wrong numbers"
    assert count_miss(ex, rec("544, 546")) == "wrong numbers"
    long = {"answer": ", ".join(str(v) for v in range(520, 626))}  # 525 ends like B = 625
    early = ", ".join(str(v) for v in range(520, 526))
    assert count_miss(long, {"right": False, "stopped": True, "text": early}) == "early at B's last two digits"


CARD = """## Training

| stage | config | steps | tokens (clean) | training clock | tokens/s (mean) | precision | final losses |
|---|---|---|---|---|---|---|---|
| AR training | `configs/tiny_ar.yaml` | 915 | 3.75M | 30.1 min | 2,079 | fp32 | AR 0.130 |
| WeDLM training (8 learnable `<|im_end|>`) | `configs/tiny_wedlm.yaml` | 1083 | 4.44M | 88.1 min | 840 | fp32 | AR 0.076, mask 0.145 |
| continued | `configs/tiny_wedlm_cont.yaml` | 1871 | 7.66M | 92.0 min | 1,388 | fp32 | AR 0.012, mask 0.036 |
| conversion (`wedlm convert`) | - | - | - | 6 s | - | - | - |
| **total** | | | **15.85M** | **210.2 min** | | | |
"""


def test_model_card_carries_rows_of_stages_whose_runs_are_gone(tmp_path):
    import json

    from recipes.model_card import carried_rows, stage_names, stage_rows

    (tmp_path / "README.md").write_text(CARD)
    carried = carried_rows(tmp_path / "README.md")
    assert sorted(carried) == ["ar", "convert", "wedlm", "wedlm-cont"]
    assert carried["wedlm-cont"]["tokens"] == 7.66e6 and carried["wedlm"]["minutes"] == 88.1
    run = tmp_path / "run"
    for name, steps, tokens in (("wedlm-simple", 1000, 4_000_000), ("wedlm-mix", 2000, 8_000_000)):
        (run / name / "final").mkdir(parents=True)
        (run / name / "final" / "config.json").write_text(json.dumps(
            {"wedlm_training": {"steps": steps, "tokens": tokens, "elapsed_s": 1500, "precision": "bf16"}}))
        (run / name / "log.jsonl").write_text("\n".join(
            json.dumps({"tokens": tokens, "ar_loss": 0.01, "mask_loss": 0.02}) for _ in range(5)))
    assert stage_names(run, carried) == ["ar", "wedlm", "wedlm-cont", "wedlm-simple", "wedlm-mix"]
    rows, totals = stage_rows(run, carried)
    assert rows[2] == CARD.splitlines()[4]  # the AR row, verbatim
    assert "| 1000 | 4.00M | 25.0 min | 2,667 | bf16 autocast | AR 0.010, mask 0.020 |" in rows[5]
    assert "| 6 s |" in rows[7]
    assert totals["tokens"] == pytest.approx(15.85e6 + 12e6)
    assert totals["minutes"] == pytest.approx(30.1 + 88.1 + 92.0 + 0.1 + 50.0)
    # a carried stage after one run here is not part of the chain
    (run / "ar" / "final").mkdir(parents=True)
    (run / "ar" / "final" / "config.json").write_text("{}")
    assert stage_names(run, carried)[:2] == ["ar", "wedlm"]  # no log.jsonl: an exported copy, not a run
    (run / "ar" / "log.jsonl").write_text("")
    assert stage_names(run, carried)[:2] == ["ar", "wedlm-simple"]


def test_lineage_v9_continues_version_8_with_its_two_stages():
    """Version 9's lineage starts from the shipped version 8 (not from session 14's trial stages),
    names its two stages with the steps of their configs, tells version 8's account as lineage_v8
    does, and ends with the `V9=1` recipe; deep11 and deep12 are the last stages of the card's table."""
    from recipes.model_card import STAGES, lineage_v8, lineage_v9, v8_account

    flat = lambda text: " ".join(text.split())  # noqa: E731  (both are filled to 100 columns)
    v8 = ["deep3", "deep4", "deep5"]
    text = flat(lineage_v9(700.4))
    assert text.startswith("This is version 9 of the shipped weights: version 8 continued by two stages (`V9=1`, "
                           "bf16 autocast). The first (`configs/tiny_wedlm_deep11.yaml`, 2,000 steps)")
    assert "AR stop weight at 1 " in text and "end weight at 40 " in text
    assert "The second (`configs/tiny_wedlm_deep12.yaml`, 1,000 steps, peak learning rate 0.00015)" in text
    assert f"Version 8 was {flat(v8_account(v8))} " in text
    assert flat(lineage_v8(v8, 700.4)).startswith(f"This is version 8 of the shipped weights: {flat(v8_account(v8))} ")
    assert text.endswith("`V9=1 bash recipes/wedlm_tiny.sh` reproduces version 9 from an empty `runs/` folder "
                         "(about 700 minutes on 2 quiet cores).")
    assert not any(f"deep{n}" in text for n in (7, 8, 9, 10))
    assert [name for name, _, _ in STAGES][-6:] == ["wedlm-deep5", "wedlm-deep11", "wedlm-deep12",
                                                   "wedlm-deep13", "wedlm-deep14", "wedlm-deep17"]


def test_lineage_v10_continues_version_9_and_ends_with_version_9s_account():
    """Version 10's lineage names its two stages with the minutes and end weights of their
    configs and the `V10=1` recipe, then tells version 9's lineage without its own recipe line."""
    from recipes.model_card import lineage_v10, v9_account

    flat = lambda text: " ".join(text.split())  # noqa: E731
    text = flat(lineage_v10(888.2))
    assert text.startswith("This is version 10 of the shipped weights: version 9 continued by two stages (`V10=1`")
    assert "(`configs/tiny_wedlm_deep13.yaml`, 80 minutes annealed on the clock)" in text
    assert "end weight from 40 to 8" in text
    assert "`V10=1 bash recipes/wedlm_tiny.sh` reproduces version 10 from an empty `runs/` folder (about 888 minutes" in text
    assert text.endswith(flat(f"Version 9 was {v9_account()}"))
    assert flat(v9_account()).startswith("version 8 continued by two stages (`V9=1`, bf16 autocast). The first "
                                         "(`configs/tiny_wedlm_deep11.yaml`, 2,000 steps)")
    assert "reproduces version 9" not in text


def test_lineage_v11_continues_version_10_and_keeps_its_account():
    """Version 11's lineage names its one stage with the minutes and learning rate of its config and
    the `V11=1` recipe, then tells version 10's lineage without version 10's recipe line (and with
    version 9's account after it)."""
    import yaml

    from recipes.model_card import REPO, lineage_v10, lineage_v11, v9_account

    flat = lambda text: " ".join(text.split())  # noqa: E731
    c17 = yaml.safe_load((REPO / "configs" / "tiny_wedlm_deep17.yaml").read_text())
    text = flat(lineage_v11(950.6))
    assert text.startswith("This is version 11 of the shipped weights: version 10 continued by one stage (`V11=1`, "
                           f"`configs/tiny_wedlm_deep17.yaml`, {c17['max_minutes']:g} minutes annealed on the clock, "
                           f"peak learning rate {c17['lr']:g}")
    assert "`V11=1 bash recipes/wedlm_tiny.sh` reproduces version 11 from an empty `runs/` folder (about 951 minutes" in text
    assert "Version 10 was version 9 continued by two stages (`V10=1`" in text
    assert "reproduces version 10" not in text and "cross-entropy" in text
    v10 = flat(lineage_v10(950.6).replace("-\n", "-"))  # filled with breaks after hyphens
    assert v10.split("`V10=1 bash")[0].split("shipped weights: version 9")[1] in text
    assert text.endswith(flat(f"Version 9 was {v9_account()}"))


def test_stop_probe_groups_values_and_reads_both_heads(tiny_wedlm):
    import torch

    from recipes.check_wedlm_tiny import stop_probe
    from wedlm.data.curriculum import count_example
    from wedlm.model.attention import DenseAttention
    from wedlm.model.loader import load_model
    from wedlm.tokenizer import load_tokenizer

    ex, _ = count_example(8, 21)  # 8..21: B = 21, 11 ends like B, 12 others
    probe = stop_probe(tiny_wedlm, {"g": [ex]})["g"]
    assert {k: v["n"] for k, v in probe.items()} == {"at B": 1, "ending like B": 1, "other": 12}
    # "at B" equals a direct forward of the whole answer (+ one [MASK] for the mask reading)
    tok = load_tokenizer(tiny_wedlm)
    model = load_model(tiny_wedlm).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": ex["prompt"]}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt + ex["answer"], add_special_tokens=False)["input_ids"] + [model.config.mask_token_id]
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], DenseAttention())[0]
    p = logits.float().softmax(-1)[:, tok.convert_tokens_to_ids("<|im_end|>")]
    assert probe["at B"]["ar"] == pytest.approx(float(p[-2]), abs=1e-5)
    assert probe["at B"]["mask"] == pytest.approx(float(p[-1]), abs=1e-5)
    assert probe["at B"]["ar>0.5"] == float(p[-2] > 0.5)


def test_stop_probe_of_an_ar_checkpoint_reads_the_ar_head_only(ckpt_factory):
    # an AR stage's checkpoint has no mask_token_id: the probe used to fail on torch.tensor([..., None])
    from recipes.check_wedlm_tiny import _num, stop_probe
    from wedlm.data.curriculum import count_example
    from wedlm.model.loader import load_model

    plain = ckpt_factory("tiny_plain_qwen3", family="qwen3", wedlm=False, tokenizer=True, seed=0)
    assert load_model(plain).config.mask_token_id is None
    ex, _ = count_example(8, 21)
    probe = stop_probe(plain, {"g": [ex]})["g"]
    assert {k: v["n"] for k, v in probe.items()} == {"at B": 1, "ending like B": 1, "other": 12}
    assert all(v["mask"] is None and v["mask>0.5"] is None and 0.0 <= v["ar"] <= 1.0 for v in probe.values())
    assert (_num(None, ".2f"), _num(0.5, ".0%")) == ("-", "50%")


@pytest.mark.parametrize("recipe, min_calls, variant", [
    ("wedlm_tiny.sh", 13, None), ("wedlm_tiny_scratch.sh", 2, "1"), ("wedlm_tiny_scratch.sh", 2, "2")])
def test_recipe_mixes_match_their_config_headers(recipe, min_calls, variant):
    """Every `mix_stage` of a recipe (the lineage's and the from-scratch one, each SCRATCH variant)
    writes exactly the mix its config's header documents (same --out file, same JSON), and the
    config trains on that file. bash itself expands each call's arguments (quoting and variables as
    the recipe would run them, the variant's `case` block included)."""
    import json
    import re
    import subprocess
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    script = (root / "recipes" / recipe).read_text().replace("\\\n", " ")
    lines = [line.strip() for line in script.splitlines()]
    variables = [line for line in lines if re.match(r"^[A-Z_]+='", line)]
    if variant is not None:  # the recipe picks its configs in a `case "$V" in ... esac` block
        start = next(i for i, line in enumerate(lines) if line.startswith("V="))
        variables = [f"SCRATCH={variant}", *lines[start:lines.index("esac", start) + 1], *variables]
    stub = "\n".join(["mix_stage() { printf '%s\\0' \"$@\"; printf '\\n'; }", *variables,
                      *(line for line in lines if line.startswith("mix_stage "))])
    out = subprocess.run(["bash", "-c", stub], capture_output=True, text=True, check=True).stdout
    calls = [call.split("\0")[:-1] for call in out.split("\n") if call]
    assert len(calls) >= min_calls and all(len(c) == 4 and c[1] for c in calls)
    if variant == "2":
        assert [c[1] for c in calls] == ["configs/scratch2_ar.yaml", "configs/scratch2_wedlm.yaml"]
    for name, config, data, mix in calls:
        text = (root / config).read_text()
        header = " ".join(line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#"))
        found = re.search(r"--out (\S+) --mix '(.*?)'", header)
        assert found, f"{config}: no --mix command in its header"
        assert found.group(1) == data, (config, found.group(1), data)
        assert json.loads(found.group(2)) == json.loads(mix), config
        assert yaml.safe_load(text)["data"] == data, config


def test_a_loss_of_exactly_the_slack_is_within_it():
    from recipes.tune_decoding import within_slack

    assert within_slack(0.92 - 0.915, 0.005) and within_slack(0.0, 0.005)
    assert not within_slack(0.92 - 0.91, 0.005)


def test_settings_take_pairs_instead_of_the_grid():
    from recipes.tune_decoding import settings

    assert settings("16", "0.1,0.2", "0.02") == [(16, 0.1, 0.02, False, False), (16, 0.2, 0.02, False, False)]
    assert settings("16,32", "0.1", "0.02", "0.05:0.004,0.1:0.008") == [
        (16, 0.05, 0.004, False, False), (16, 0.1, 0.008, False, False), (32, 0.05, 0.004, False, False),
        (32, 0.1, 0.008, False, False)]
    assert settings("16", "0.1", "0.02", "0.2:0.015", "0,1,run") == [
        (16, 0.2, 0.015, False, False), (16, 0.2, 0.015, True, False), (16, 0.2, 0.015, True, True)]
    for bad in ("0.1", "a:0.02", "0.1:"):
        with pytest.raises(ValueError, match=f"--pairs.*{bad!r}"):
            settings("16", "0.1", "0.02", bad)
    with pytest.raises(ValueError, match="--stop-by-ar: expected 0, 1 or run, got 'yes'"):
        settings("16", "0.1", "0.02", None, "0,yes")


def test_lr_sweep_arms_parse_and_loss_windows(tmp_path):
    from recipes.scratch_lr_sweep import arm_overrides, loss_at, markdown, rolling, summary
    from wedlm.cli.train import parse_overrides
    from wedlm.train.config import TrainConfig

    cfg = TrainConfig.from_yaml("configs/scratch_ar.yaml", parse_overrides(arm_overrides(5e-4, tmp_path / "a")))
    assert (cfg.lr, cfg.min_lr, cfg.micro_batch, cfg.warmup_steps) == (5e-4, 5e-5, 1, 200)
    assert (cfg.max_minutes, cfg.save_every, cfg.out_dir) == (12.0, 400, str(tmp_path / "a"))

    with pytest.raises(FileNotFoundError, match="no log.jsonl"):
        summary(tmp_path)
    rows = [{"step": 10 * i, "tokens": 50_000 * i, "ar_loss": float(i), "tok_s": 2000.0 + i,
             "elapsed_s": 60.0 * i} for i in range(1, 9)]
    assert loss_at(rows, 100_000) == 2.5  # logged at 50k..200k (steps 1-4)
    assert loss_at(rows, 275_000, half_width=50_000) == 5.5  # 250k and 300k
    assert loss_at(rows, 2_000_000) is None
    assert rolling([1.0, 3.0, 5.0, 7.0], n=2) == [1.0, 2.0, 4.0, 6.0]

    run = tmp_path / "a"
    run.mkdir()
    (run / "log.jsonl").write_text("\n".join(json.dumps(r) for r in reversed(rows)) + "\n")
    (run / "train_config.json").write_text(json.dumps({"lr": 5e-4}))
    s = summary(run)
    assert (s["steps"], s["tokens"], s["end"]) == (80, 400_000, 7.0)  # logged at 300k..400k
    assert s["tok_s"] == (400_000 - 150_000) / (480 - 180)  # slope from the first row past 120 s
    assert s["at"][:3] == [5.0, 8.0, None] and "| a | 0.0005 | 5.000 | 8.000 | - |" in markdown([s])
