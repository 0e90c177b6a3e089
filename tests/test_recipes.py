"""The tiny model's recipes: the stages chain from data to card, the model card's numbers come from
the evaluation, the decoding-defaults pick of recipes/tune_decoding.py, the check items, the
learning-rate sweep's arms and report."""

import json
import re
from pathlib import Path

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


def _summary(window=16):
    """A summary.json of recipes/eval_wedlm_tiny.py with distinct numbers in every cell."""
    def task(n, acc, tpf):
        return {"n": n, "accuracy": acc, "stopped": 1.0, "tokens_per_forward": tpf, "p_cache": 0.9}

    def one(n, exact, tpf):
        return {"n": n, "exact": exact, "accuracy": exact, "stopped": 1.0, "tokens_per_forward": tpf, "wrong": []}

    def demo(exact, forwards):
        return {"exact": exact, "stopped": True, "tokens": 891, "forwards": forwards,
                "tokens_per_forward": 891 / forwards}

    return {"window": window, "tau": 0.15, "lambda": 0.015, "precision": "bf16 autocast", "plots": [],
            "tasks_total": {"ar": {"count": task(200, 0.925, 1.0), "addsub": task(100, 1.0, 1.0)},
                            "wedlm": {"count": task(200, 0.91, 7.46), "addsub": task(100, 0.99, 3.81)},
                            "verified": {"count": task(200, 0.925, 7.02), "addsub": task(100, 1.0, 3.2)}},
            "from_one": {"ar": {"test": one(13, 12 / 13, 1.0), "val": one(20, 0.95, 1.0)},
                         "wedlm": {"test": one(13, 11 / 13, 7.7), "val": one(20, 0.9, 7.9)}},
            "count200": {f"W={window}": {"ar": demo(True, 891), "wedlm": demo(True, 112), "verified": demo(False, 150)},
                         "W=32": {"ar": demo(True, 891), "wedlm": demo(False, 60), "verified": demo(False, 99)}}}


def _table(text: str) -> dict[str, list[str]]:
    """The card's evaluation table: first cell -> the other cells."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_model_card_numbers_come_from_the_eval_summary(tiny_wedlm, tmp_path):
    import shutil

    from recipes.model_card import main, parameters

    model = tmp_path / "model"
    shutil.copytree(tiny_wedlm, model)
    (tmp_path / "summary.json").write_text(json.dumps(_summary()))
    assert main(["--eval", str(tmp_path / "summary.json"), "--model", str(model)]) == 0
    text = (model / "README.md").read_text()
    table = _table(text)
    assert table["test split: counting"] == ["200", "92.5%", "91.0%", "92.5%", "7.46"]
    assert table["test split: two-digit sums and differences"] == ["100", "100.0%", "99.0%", "100.0%", "3.81"]
    assert table["\"Count from 1 to N.\", N in 10..300, test keys"] == ["13", "92.3%", "84.6%", "-", "7.70"]
    assert table["\"Count from 1 to N.\", N in 10..300, validation keys"] == ["20", "95.0%", "90.0%", "-", "7.90"]
    # the demo at the model's window (16), not at W=32
    assert table["\"Count from 1 to 200.\" (a training prompt)"] == ["1", "exact", "exact", "wrong",
                                                                      "7.96 (112 forwards)"]
    n_params = parameters(model)
    assert 1000 < n_params < 10_000_000 and f"A {n_params / 1e6:.2f}M-parameter WeDLM" in text
    from wedlm.engine.defaults import model_decoding_defaults

    gen = model_decoding_defaults(str(model))
    assert f"tau={gen['wedlm_entropy_threshold']}" in text and f"W={gen['wedlm_window_size']}" in text


def test_the_shipped_card_matches_the_shipped_model_and_stays_short():
    from pathlib import Path

    from recipes.model_card import parameters

    model = Path(__file__).resolve().parents[1] / "models" / "wedlm-tiny"
    text = (model / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert f"A {parameters(model) / 1e6:.2f}M-parameter WeDLM" in text
    gen = json.loads((model / "generation_config.json").read_text())
    assert f"W={gen['wedlm_window_size']}, entropy threshold tau={gen['wedlm_entropy_threshold']}" in text
    assert "Count from 1 to 200." in text and "training prompt" in text and "Apache-2.0" in text


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


def recipe_plan(recipe: str, **env: str) -> list[list[str]]:
    """The steps `DRY_RUN=1 bash recipes/RECIPE` prints: [name, command...] per step (nothing runs)."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["bash", str(root / "recipes" / recipe)], capture_output=True, text=True, check=True,
                         env={**os.environ, **env, "DRY_RUN": "1"}).stdout
    return [line.rstrip("\t").split("\t") for line in out.splitlines() if "\t" in line]


def chain(plan: list[list[str]], start: str | None = None) -> list[tuple[str, str, str, str]]:
    """Walk a recipe's plan the way it would run and check that it chains; returns one
    (stage, config, starts from, data) row per training stage.

    Every training stage's config exists and loads with its `--set` overrides, its `init` is the
    previous step's output (a training stage's final/, a conversion's or growth's folder), its
    data file is written by an earlier step, and the export reads the last stage's final/. `start`:
    the model the recipe's first stage starts from (None: random weights)."""
    import json

    from wedlm.cli.train import parse_overrides
    from wedlm.train.config import TrainConfig

    made, current, rows = set(), start, []
    for name, *cmd in plan:
        if "--out" in cmd:  # a data step: its --out file, or folder of train/simple_stop files
            out = cmd[cmd.index("--out") + 1]
            made |= {out, f"{out}/train.jsonl", f"{out}/simple_stop.jsonl"}
            if "--mix" in cmd:
                json.loads(cmd[cmd.index("--mix") + 1])
        module = cmd[cmd.index("-m") + 1] if "-m" in cmd else None
        args = cmd[cmd.index("-m") + 2:] if module else []
        if module == "wedlm.cli.main" and args[:2] == ["train", "--config"]:
            sets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
            cfg = TrainConfig.from_yaml(args[2], parse_overrides(sets))
            assert cfg.data in made, (name, cfg.data)
            if current is not None or cfg.init is not None:
                assert cfg.init == current, (name, cfg.init, current)
            assert name == cfg.out_dir.rsplit("/", 1)[-1], (name, cfg.out_dir)
            rows.append((name, args[2], cfg.init or "random weights", cfg.data))
            current = f"{cfg.out_dir}/final"
        elif (module, args[:1]) == ("wedlm.cli.main", ["convert"]) or module == "wedlm.train.grow":
            src, dst = args[-2:]
            assert src == current, (name, src, current)
            current = dst
        elif module == "wedlm.train.export":
            assert args[0] == current, (name, args[0], current)
    return rows


def test_the_shipped_recipe_chains_every_stage_from_data_to_card():
    plan = recipe_plan("wedlm_tiny.sh")
    rows = chain(plan)
    names = [row[0] for row in rows]
    assert names[:3] == ["ar", "wedlm", "wedlm-cont"]
    assert len(names) == len(set(names)) == 27  # every stage writes its own folder
    assert rows[0][2] == "random weights" and rows[1][2] == "runs/wedlm-tiny/ar-wedlm"
    assert rows[-5:] == [
        ("wedlm-offset", "configs/tiny_wedlm_offset.yaml", "runs/wedlm-tiny/wedlm-deep14/final", "data/widen/v33mix.jsonl"),
        ("from-one", "configs/tiny_wedlm_from_one.yaml", "runs/wedlm-tiny/wedlm-offset/final",
         "data/widen/from-one-mix.jsonl"),
        ("hundreds", "configs/tiny_wedlm_hundreds.yaml", "runs/wedlm-tiny/from-one/final", "data/widen/hundreds-mix.jsonl"),
        ("hundreds2", "configs/tiny_wedlm_hundreds.yaml", "runs/wedlm-tiny/hundreds/final",
         "data/widen/hundreds2-mix.jsonl"),
        ("replay", "configs/tiny_wedlm_hundreds.yaml", "runs/wedlm-tiny/hundreds2/final", "data/widen/replay-mix.jsonl")]
    steps = [step[0] for step in plan]
    assert steps[-4:] == ["export", "tune", "eval", "card"]
    assert plan[-4][1:] == ["python", "-m", "wedlm.train.export", "runs/wedlm-tiny/replay/final", "models/wedlm-tiny"]


@pytest.mark.parametrize("variant, configs", [("1", ["configs/scratch_ar.yaml", "configs/scratch_wedlm.yaml"]),
                                              ("2", ["configs/scratch2_ar.yaml", "configs/scratch2_wedlm.yaml"])])
def test_the_scratch_recipe_chains_its_two_stages(variant, configs):
    plan = recipe_plan("wedlm_tiny_scratch.sh", SCRATCH=variant)
    rows = chain(plan)
    assert [row[1] for row in rows] == configs
    assert [row[2] for row in rows] == ["random weights", f"runs/wedlm-tiny-scratch{'2' if variant == '2' else ''}/ar-wedlm"]


def test_every_config_is_used_by_a_recipe_or_a_recipe_helper():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    used = {row[1] for row in chain(recipe_plan("wedlm_tiny.sh"))}
    for variant in ("1", "2"):
        used |= {row[1] for row in chain(recipe_plan("wedlm_tiny_scratch.sh", SCRATCH=variant))}
    quickstart = (root / "recipes" / "quickstart_train.sh").read_text()
    used |= set(re.findall(r"configs/[\w.-]+\.yaml", quickstart))
    assert sorted(str(p.relative_to(root)) for p in (root / "configs").glob("*.yaml")) == sorted(used)


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


def test_smollm2_prompts_are_distinct_seeded_and_bounded():
    from recipes.smollm2_wedlm import make_prompts

    prompts = make_prompts(3160, seed=0)
    assert len(set(prompts)) == 3160  # the GPU script asks for 3,000 + 128 held out
    assert make_prompts(5, seed=0) == prompts[:5] and make_prompts(5, seed=1) != prompts[:5]
    assert "Compare a volcano and a volcano." not in prompts  # pairs of distinct fillers only
    with pytest.raises(SystemExit, match="at most 3160 distinct prompts"):
        make_prompts(3161, seed=0)


def test_the_gpu_recipe_script_refuses_a_machine_without_cuda(tmp_path):
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the recipe instead of refusing")
    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_smollm2_wedlm.sh"
    run = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True,
                         text=True, env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and "no CUDA device" in run.stderr
    assert not (tmp_path / "out").exists()
