"""analysis.experiments and its measurements: t-intervals, paired differences, MaxVio from routing
records, evaluation-time overrides and gradient norms at initialisation."""

from __future__ import annotations

import json
import math

import pytest
from omegaconf import OmegaConf

from analysis.experiments import cell_tag, fmt_ci, paired_difference, t_interval, wall_seconds
from analysis.measurements.extrapolation import eval_overrides
from analysis.measurements.init_grad_norms import init_grad_norms
from analysis.measurements.routing import maxvio
from archlab.config import load_recipe


def test_t_interval_of_three_values():
    iv = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n), sd = 1
    assert (iv["mean"], iv["sd"], iv["n"]) == (2.0, 1.0, 3)
    assert iv["low"] == pytest.approx(2.0 - half) and iv["high"] == pytest.approx(2.0 + half)
    assert fmt_ci(iv) == f"2.000 [{2 - half:.3f}, {2 + half:.3f}]"


def test_a_runs_wall_time_is_the_sweeps_else_its_own(tmp_path, fake_run):
    run = fake_run(tmp_path / "r", "recipes/dense/tiny.yaml", [], tokens=4096, loss=5.0,
                   summary_extra={"elapsed_s": 98.5})
    assert wall_seconds({"run_dir": str(run), "elapsed_s": 101.2}) == 101.2  # the sweep's: launch to exit
    assert wall_seconds({"run_dir": str(run), "elapsed_s": None}) == 98.5  # a manifest that lost it
    bare = fake_run(tmp_path / "bare", "recipes/dense/tiny.yaml", [], tokens=4096, loss=5.0)
    assert wall_seconds({"run_dir": str(bare)}) is None and wall_seconds({"run_dir": str(tmp_path / "gone")}) is None


def test_one_value_has_no_interval_and_nothing_is_not_zero():
    assert t_interval([5.0]) == {"mean": 5.0, "low": None, "high": None, "sd": None, "n": 1}
    assert fmt_ci(t_interval([5.0])) == "5.000 (1 seed)"
    assert t_interval([float("nan")])["mean"] is None and fmt_ci(t_interval([])) == "-"


def test_paired_difference_uses_the_seeds_both_arms_have():
    a = {0: 4.0, 1: 4.5, 2: 5.0, 3: float("nan")}
    b = {0: 4.1, 1: 4.4, 3: 4.0, 4: 4.0}
    d = paired_difference(a, b)
    assert d["seeds"] == [0, 1] and d["n"] == 2
    assert d["mean"] == pytest.approx(((4.0 - 4.1) + (4.5 - 4.4)) / 2)
    # pairing removes the shared seed-to-seed spread: equal shifts give a zero-width interval
    same = paired_difference({0: 4.0, 1: 5.0, 2: 6.0}, {0: 4.1, 1: 5.1, 2: 6.1})
    assert same["mean"] == pytest.approx(-0.1) and same["high"] - same["low"] == pytest.approx(0.0, abs=1e-12)
    assert fmt_ci(same, signed=True).startswith("-0.100 [")


def test_cell_tags_name_the_last_key_part():
    assert cell_tag({"train.lr": "1e-3", "train.warmup_steps": "0"}) == "lr=1e-3, warmup_steps=0"
    assert cell_tag({}) == ""


def test_eval_overrides_fill_the_factor_and_training_length():
    o = ["model.position.rope_scaling.factor={factor}", "model.position.rope_scaling.original_max_seq_len={L}",
         "model.position.rope_scaling.type=yarn"]
    assert eval_overrides(o, 4, 128) == ["model.position.rope_scaling.factor=4", "model.position.rope_scaling."
                                         "original_max_seq_len=128", "model.position.rope_scaling.type=yarn"]


def test_maxvio_global_sums_the_loads_over_training_and_per_record_does_not(tmp_path):
    """Two records, each imbalanced the other way: balanced over training (global 0), MaxVio 0.5
    in every record."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"archlab_run": 1, "name": "run"}))
    cfg = load_recipe("recipes/mixtral/tiny.yaml")
    (run / "recipe.yaml").write_text(OmegaConf.to_yaml(cfg))
    rows = [{"step": 10, "moe/layer0/tokens_per_expert": [3, 1], "moe/layer1/tokens_per_expert": [2, 2]},
            {"step": 20, "moe/layer0/tokens_per_expert": [1, 3], "moe/layer1/tokens_per_expert": [2, 2]}]
    (run / "routing.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = maxvio(str(run))
    assert m["layers"]["layer0"] == {"global": 0.0, "batch": 0.5}
    assert m["layers"]["layer1"] == {"global": 0.0, "batch": 0.0}
    assert (m["global"], m["batch"]) == (0.0, 0.25)


def test_init_grad_norms_are_the_runs_initial_weights_and_differ_by_placement(tmp_path):
    tiny = ["model.vocab_size=300", "data.tokenizer=byte", "data.max_bytes=60000", f"data.cache_dir={tmp_path}",
            "model.d_model=32", "train.seq_len=16", "train.micro_batch_size=2"]
    pre = init_grad_norms("recipes/dense/tiny.yaml", [*tiny, "model.n_layers=3"], seed=0, batches=1)
    again = init_grad_norms("recipes/dense/tiny.yaml", [*tiny, "model.n_layers=3"], seed=0, batches=1)
    post = init_grad_norms("recipes/dense/tiny.yaml", [*tiny, "model.n_layers=3", "model.norm.placement=post"],
                           seed=0, batches=1)
    assert pre == again  # the same seed builds the same weights and draws the same batch
    assert len(pre["per_layer"]) == 3 and all(v > 0 for v in pre["per_layer"] + post["per_layer"])
    assert pre["per_layer"] != post["per_layer"]
    assert pre["loss"] == pytest.approx(math.log(300), rel=0.1)  # near-uniform predictions at initialisation
