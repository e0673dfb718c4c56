"""tools.experiment: spec checks, arm resolution, time-matched budgets, and every committed
experiment end to end in --quick mode (tiny models, a few steps, one seed): the report's
structure, its numbers, and a second call that skips the finished runs."""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from analysis.experiment_spec import Spec
from analysis.measurements import MEASUREMENTS
from tools import experiment
from tools.experiment import load_spec, main, match_time_budgets, resolve_arms
from tools.sweep.plan import build_points

EXPERIMENTS = ["evolution", "extrapolation", "attention-kv", "norm-placement", "balancing", "moe-vs-dense"]
# the report sections each measurement of a spec adds (their titles in report.md)
SECTION_TITLES = {name: f"## {m.title}" for name, m in MEASUREMENTS.items()}


@pytest.fixture(autouse=True)
def _in_repo_root(root, monkeypatch):
    monkeypatch.chdir(root)  # specs name recipes relative to the repository root


def _write_spec(tmp_path: Path, **spec) -> str:
    base = {"name": "t", "budget": {"tokens": 4096}, "arms": [{"name": "a", "recipe": "recipes/llama/tiny.yaml"}],
            "tune": {"shared": "spec checks only: nothing is trained"}}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({**base, **spec}))
    return str(path)


# --------------------------------------------------------------------------------------------
# specs and arms
# --------------------------------------------------------------------------------------------


def test_arms_inherit_their_parents_overrides_and_previous_skips_side_arms(tmp_path):
    spec = load_spec(_write_spec(tmp_path, set=["model.n_layers=2"], arms=[
        {"name": "base", "recipe": "recipes/vanilla/tiny.yaml", "set": ["train.lr=1e-3"]},
        {"name": "pre", "extends": "previous", "set": ["model.norm.placement=pre"]},
        {"name": "side", "extends": "base", "side": True, "set": ["model.position.type=learned"]},
        {"name": "rope", "extends": "previous", "set": ["model.position.type=rope"]},
    ]))
    arms = {a.name: a for a in resolve_arms(spec)}
    assert arms["pre"].overrides == ["model.n_layers=2", "train.lr=1e-3", "model.norm.placement=pre"]
    assert arms["rope"].parent == "pre" and arms["side"].parent == "base"  # previous = the last non-side arm
    assert arms["rope"].overrides[-2:] == ["model.norm.placement=pre", "model.position.type=rope"]
    assert arms["rope"].own == ["model.position.type=rope"] and arms["rope"].recipe == "recipes/vanilla/tiny.yaml"
    assert spec.reference == "base" and spec.seeds == [0, 1, 2]


@pytest.mark.parametrize("quick", [False, True])
def test_every_spec_survives_the_record_as_it_loaded(root, quick):
    """The record keeps ``Spec.to_dict()`` as JSON; the report reads it back with ``Spec.from_dict``."""
    for path in sorted((root / "experiments").glob("*.yaml")):
        spec = load_spec(str(path), quick=quick)
        assert Spec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec, path.name


@pytest.mark.parametrize("spec,message", [
    ({"arms": [{"name": "a", "recipe": "recipes/nope.yaml"}]}, "arms[0].recipe='recipes/nope.yaml': file not found"),
    ({"arms": [{"name": "a", "extends": "b"}]}, "extends 'b', which is not an arm listed before it"),
    ({"arms": [{"name": "a", "extends": "previous"}]}, "'extends: previous' on the first arm"),
    ({"arms": [{"name": "a b", "recipe": "recipes/llama/tiny.yaml"}]}, "arm name 'a b'"),
    ({"arms": [{"name": "a", "recipe": "recipes/llama/tiny.yaml", "sett": []}]}, "unknown keys ['sett']"),
    ({"budget": {"tokens": -1}}, "budget.tokens=-1: must be a positive number"),
    ({"budget": {"steps": 10}}, "unknown budget kind 'steps'"),
    ({"set": ["train.seed=3"]}, "train.seed is chosen by 'seeds:'"),
    ({"seeds": [0, -1]}, "seeds=[0, -1]"),
    ({"reference": "zzz"}, "reference='zzz': not an arm"),
    ({"measurements": {"perplexity": {}}}, "measurements: unknown ['perplexity']"),
    ({"measurements": {"extrapolation": {"multiplier": [1, 2]}}},
     "measurements.extrapolation: unknown keys ['multiplier']"),
    ({"measurements": {"throughput": {"steps": 0}}}, "measurements.throughput.steps=0: expected an integer >= 1"),
    ({"quick": {"measurements": {"routing": {"heatmap": ["a"]}}}}, "quick.measurements.routing: unknown keys"),
    ({"colour": "red"}, "unknown keys ['colour']"),
    ({"tune": None}, "'tune:' is required: each arm's lr tuned"),
    ({"set": ["model.d_model=30"]}, "arm a (recipes/llama/tiny.yaml + its overrides)"),
    ({"quick": {"arms": ["zzz"]}}, "quick.arms: ['zzz'] are not arms"),
    ({"arms": [{"name": "a", "recipe": "recipes/llama/tiny.yaml"},
               {"name": "b", "extends": "a", "budget": {"match_time_of": "c"}}]}, "budget.match_time_of='c'"),
])
def test_bad_specs_fail_clearly_before_anything_runs(tmp_path, capsys, spec, message):
    path = _write_spec(tmp_path, **spec)
    assert main(["plan", path, "--out", str(tmp_path / "out"), *(["--quick"] if "quick" in spec else [])]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_sweep_spec_has_one_ladder_per_arm_with_its_budget_and_seeds_last(tmp_path):
    spec = load_spec(_write_spec(tmp_path, seeds=[0, 1], grid={"train.lr": [1e-3, 3e-3]}, arms=[
        {"name": "a", "recipe": "recipes/llama/tiny.yaml"},
        {"name": "b", "extends": "a", "budget": {"flops": 1e12}}]))
    arms = resolve_arms(spec)
    sspec = experiment.sweep_spec(spec, arms, "sweep", {a.name: a.budget for a in arms})
    points = {p.name: p for p in build_points(sspec)}
    assert len(points) == 2 * 2 * 2
    assert "a-lr0.001-seed1-tok4096" in points and "b-lr0.003-seed0-flop1e12" in points
    p = points["b-lr0.003-seed0-flop1e12"]
    assert (p.budget_kind, p.budget) == ("flops", 1e12)
    assert p.cell == {"train.lr": "0.003", "train.seed": "0"}  # the point's own grid values, not decoded from overrides


def test_time_matched_budget_is_the_target_time_at_the_measured_speed(tmp_path):
    runs = []
    for arm, tokens, speed in (("moe", 1000, 100.0), ("moe", 1000, 50.0), ("dense", 1000, 200.0)):
        d = tmp_path / f"{arm}-{speed}"
        d.mkdir()
        (d / "summary.json").write_text(json.dumps({"status": "completed", "tokens": tokens}))
        # windows: a slow start-up (left out), then the speed twice and one outlier (the median ignores it)
        rows = [{"kind": "train", "tokens_per_s": v} for v in (1.0, speed, speed, 100 * speed)]
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        runs.append({"arm": arm, "run_dir": str(d)})
    arm = experiment.Arm(name="dense-time", label="", recipe="", overrides=[], own=[],
                         budget=experiment.Budget("match_time_of", match_time_of="moe", speed_of="dense"))
    budget = match_time_budgets({}, [arm], runs)["dense-time"]
    assert budget["seconds"] == pytest.approx((10 + 20) / 2)  # mean of 1000/100 and 1000/50
    assert budget["tokens"] == pytest.approx(15 * 200)
    arm = replace(arm, budget=replace(arm.budget, match_time_of="nothing"))
    with pytest.raises(ValueError, match="arm 'nothing' has no completed run"):
        match_time_budgets({}, [arm], runs)


# --------------------------------------------------------------------------------------------
# every experiment end to end, quick
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("data-cache")  # one tokenised corpus for every quick run


def quick_args(name: str, out: Path, cache: Path) -> list[str]:
    return ["run", f"experiments/{name}.yaml", "--quick", "--out", str(out), "--set", f"data.cache_dir={cache}",
            "--jobs", "2", "--threads", "1"]


@pytest.fixture(scope="module")
def quick(tmp_path_factory, cache):
    """Run an experiment spec in --quick mode once per module; returns (out folder, report folder)."""
    done: dict[str, tuple[Path, Path]] = {}

    def run(name: str) -> tuple[Path, Path]:
        if name not in done:
            out = tmp_path_factory.mktemp(name) / "runs"
            assert main(quick_args(name, out, cache)) == 0, name
            done[name] = (out, out / "report")
        return done[name]

    return run


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_quick_experiment_writes_a_complete_report(quick, root, name):
    out, report = quick(name)
    spec = load_spec(str(root / "experiments" / f"{name}.yaml"), quick=True)
    md = (report / "report.md").read_text()
    data = json.loads((report / "report.json").read_text())
    # the command that regenerates it, the setup, one section per measurement, every run
    assert f"python -m tools.experiment run experiments/{name}.yaml --quick --out {out}" in md
    assert data["command"] in md
    for title in ["## Regenerate", "## Setup", "## Runs left out of the analysis", "## Every run"] + \
            [SECTION_TITLES[m] for m in spec.wanted]:
        assert title in md, title
    if not spec.grid:
        assert "## Results" in md and "mean [95% CI]" in md
    # figures: every one named in the markdown exists and is a PNG
    assert isinstance(data["excluded_runs"], list)  # each with its run, stage and why
    assert all({"run", "stage", "why"} <= set(r) for r in data["excluded_runs"])
    assert data["figures"]
    for fig in data["figures"]:
        assert f"]({fig})" in md
        assert (report / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # numbers: a finite loss and the costs for every arm that was trained
    trained = spec.only_arms or [a.name for a in spec.arms]
    assert sorted({g["arm"] for g in data["groups"]}) == sorted(trained)
    for g in data["groups"]:
        assert _finite(g["loss"]["mean"]) and g["loss"]["n"] == 1, g["arm"]
        c, m = g["costs"], g["measured"]
        assert c["params_total"] >= c["params_active"] > 0 and c["flops_per_token"] > 0
        assert c["kv_bytes_per_token"] > 0
        assert m["tokens_per_s"]["mean"] > 0 and m["peak_rss_bytes"] > 50 * 2**20  # python + torch at least
        if g["arm"] != spec.reference and not g["cell"]:
            assert _finite(g["vs_reference"]["mean"]) and g["vs_reference"]["seeds"] == [0]
    for run in data["runs"]:
        assert run["status"] == "finished" and run["peak_rss_bytes"] > 0 and run["elapsed_s"] > 0
    manifest = json.loads((out / "sweep" / "manifest.json").read_text())
    assert all(p["peak_rss_bytes"] > 0 for p in manifest["points"])
    assert set(data["sections"]) == set(spec.wanted)
    # the stages: every arm's lr tuned (or shared by design, said so), the comparison classified
    if not spec.tune.searched:
        assert "## Learning rate" in md and spec.tune.shared[:40] in md
    else:
        assert "## Learning rate, tuned per arm" in md and "tuning.png" in data["figures"]
        timed = {a["name"] for a in data["arms"] if "match_time_of" in a["budget"]}  # they take their parent's lr
        assert set(data["tuning"]) == set(trained) - timed
        for t in data["tuning"].values():
            assert len(t["lrs"]) >= len(spec.tune.lr) and t["lr"] in t["lrs"]
    if not spec.grid:
        assert "## Compute-equivalent gain and verdicts" in md
        parents = {a["name"]: a["parent"] for a in data["arms"]}
        for arm in trained:
            # verdicts: parent tests a step against the arm it extends, when that arm trained too
            against = parents[arm] if spec.verdicts == "parent" else spec.reference
            if arm != spec.reference and against in trained:
                assert data["comparison"]["arms"][arm]["class"] in ("better", "worse", "equivalent within the margin",
                                                                   "unresolved")


def test_quick_evolution_ladder_steps_pair_each_arm_with_its_parent(quick):
    _, report = quick("evolution")
    data = json.loads((report / "report.json").read_text())
    steps = {s["arm"]: s for s in data["sections"]["ladder"]["steps"]}
    groups = {g["arm"]: g for g in data["groups"]}
    assert steps["vanilla"]["step"] is None  # the start of the ladder
    pre = steps["pre-ln"]
    assert pre["parent"] == "vanilla"
    assert pre["step"]["mean"] == pytest.approx(groups["pre-ln"]["loss"]["mean"] - groups["vanilla"]["loss"]["mean"])
    assert steps["deepseek"]["parent"] is None  # its parent (mixtral) is not trained in quick mode


def test_quick_extrapolation_reports_learned_positions_not_applicable_past_their_table(quick):
    _, report = quick("extrapolation")
    data = json.loads((report / "report.json").read_text())
    variants = {v["variant"]: v for v in data["sections"]["extrapolation"]["variants"]}
    assert {"rope", "learned", "alibi", "rope-pi", "rope-ntk", "rope-yarn"} <= set(variants)
    learned = variants["learned"]
    assert sorted(learned["not_applicable"]) == ["2", "4", "8"]  # JSON keys
    assert "model.max_seq_len=32" in learned["not_applicable"]["2"]
    assert _finite(learned["per_multiplier"]["1"]["loss"]["mean"])
    for name in ("alibi", "rope-yarn"):
        per = variants[name]["per_multiplier"]
        assert all(_finite(per[m]["loss"]["mean"]) for m in ("1", "2", "4", "8")), name
        curve = variants[name]["per_position"]["8"]
        assert len(curve["loss"]) * curve["bin_width"] == 8 * 32
    # at L the scalings have factor 1: the same model as plain RoPE
    rope, pi = variants["rope"]["per_multiplier"]["1"]["loss"]["mean"], variants["rope-pi"]["per_multiplier"]["1"]
    assert pi["loss"]["mean"] == pytest.approx(rope, abs=1e-5)


def test_quick_moe_vs_dense_trains_the_time_matched_arm_after_the_others(quick):
    out, report = quick("moe-vs-dense")
    data = json.loads((report / "report.json").read_text())
    budget = data["timed_budgets"]["dense-time-mixtral"]
    timed = next(g for g in data["groups"] if g["arm"] == "dense-time-mixtral")
    assert timed["measured"]["tokens"] >= budget["tokens"] > 0
    assert (out / "sweep-time" / "manifest.json").is_file()
    comp = data["sections"]["wall_clock"]["comparisons"][0]
    assert _finite(comp["equal_flops"]["mean"]) and _finite(comp["equal_time"]["mean"])
    # the time-matched tokens: the MoE's tokens at the dense arm's benchmark speed over the MoE's
    bench = {a["arm"]: a["tokens_per_s"] for a in data["sections"]["throughput"]["arms"]}
    moe_tokens = next(g for g in data["groups"] if g["arm"] == "mixtral")["measured"]["tokens"]
    assert budget["speeds_from"] == "throughput benchmark"
    assert budget["tokens"] == pytest.approx(moe_tokens * bench["dense"] / bench["mixtral"], rel=5e-3)


def test_quick_norm_placement_measures_every_depth_and_grid_cell(quick):
    _, report = quick("norm-placement")
    data = json.loads((report / "report.json").read_text())
    groups = data["sections"]["init_grad_norms"]["groups"]
    assert sorted((g["arm"], g["depth"]) for g in groups) == [("post-ln", 2), ("post-ln", 3), ("post-ln-2017", 2),
                                                              ("post-ln-2017", 3), ("pre-ln", 2), ("pre-ln", 3)]
    assert all(len(g["per_layer_mean"]) == g["depth"] and min(g["per_layer_mean"]) > 0 for g in groups)
    cells = data["sections"]["stability"]["cells"]
    assert len(cells) == 3 * 2 and all(c["outcomes"][0] in ("learned", "did not learn", "diverged") for c in cells)


def test_quick_balancing_reports_maxvio_per_arm(quick):
    _, report = quick("balancing")
    data = json.loads((report / "report.json").read_text())
    arms = data["sections"]["routing"]["arms"]
    assert {a["arm"] for a in arms} == {"mixtral-none", "mixtral-bias"}
    for a in arms:
        assert a["maxvio_global"]["mean"] >= 0 and a["maxvio_batch"]["mean"] >= a["maxvio_global"]["mean"] - 1e-9
    assert {"load_heatmap_mixtral-none.png", "load_heatmap_mixtral-bias.png"} <= set(data["figures"])


def test_a_second_run_skips_the_finished_runs(quick, cache, capsys):
    out, report = quick("evolution")
    before = json.loads((out / "sweep" / "manifest.json").read_text())["points"]
    mtime = {p["name"]: (Path(p["run_dir"]) / "summary.json").stat().st_mtime for p in before}
    capsys.readouterr()
    assert main(quick_args("evolution", out, cache)) == 0
    after = json.loads((out / "sweep" / "manifest.json").read_text())["points"]
    assert [p["elapsed_s"] for p in after] == [p["elapsed_s"] for p in before]
    assert all((Path(p["run_dir"]) / "summary.json").stat().st_mtime == mtime[p["name"]] for p in after)
    captured = capsys.readouterr()
    assert f"{len(before)} points, {len(before)} already done" in captured.out + captured.err
    assert (report / "report.md").is_file()
    # plan on an experiment whose seeded runs trained at the tuned lrs: lists the stages, trains nothing
    plan_args = ["plan" if a == "run" else a for a in quick_args("evolution", out, cache)][:-4]
    assert main(plan_args) == 0
    assert "== stage 2: seeded runs" in capsys.readouterr().out
    assert json.loads((out / "sweep" / "manifest.json").read_text())["points"] == after


def test_report_takes_the_current_specs_words_but_the_records_runs(quick, root, tmp_path):
    """`report` after a spec's title, claim or an arm's label changed: the report says the new
    words; which runs it reports (arms, overrides, budgets) still comes from the record."""
    out, _ = quick("attention-kv")
    text = (root / "experiments" / "attention-kv.yaml").read_text()
    assert text.count("label: MHA (8 KV heads)") == 1
    edited = tmp_path / "attention-kv.yaml"
    edited.write_text(text.replace('title: "MHA, GQA, MQA and MLA', 'title: "Renamed MHA, GQA, MQA and MLA')
                      .replace("label: MHA (8 KV heads)", "label: full multi-head"))
    report = tmp_path / "report"
    assert main(["report", str(edited), "--quick", "--out", str(out), "--report", str(report)]) == 0
    md = (report / "report.md").read_text()
    assert md.startswith("# Smoke test (--quick): Renamed MHA, GQA, MQA and MLA") and "full multi-head (`mha`)" in md
    record = json.loads((out / "experiment.json").read_text())
    assert [a["name"] for a in record["arms"]] == ["mha", "mqa"]  # the record on disk is unchanged


def test_ceg_limits_leave_room_around_the_reference():
    from analysis.ceg_report import ceg_limits

    for values in ([1.0, 1.0, 3.3, 2.9, 1.25], [1.0, 0.99, 1.08], [2.0, 3.0], [0.5, 0.8, None]):
        lo, hi = ceg_limits(values)
        span = math.log(hi / lo)
        for v in [1.0] + [x for x in values if x]:
            assert 0.05 <= math.log(v / lo) / span <= 0.95, (values, v)


def test_quick_without_a_quick_block_shrinks_budget_tuning_grid_and_curve_seeds(tmp_path, capsys):
    path = _write_spec(tmp_path, budget={"tokens": 1.0e6}, seeds=[0, 1, 2],
                       tune={"lr": [1e-3, 2e-3, 4e-3], "max_extend": 3},
                       ceg={"fractions": [0.25, 0.5, 1.0, 2.0], "seeds": [0, 1, 2]})
    full = load_spec(path)
    assert full.budget.to_dict() == {"tokens": 1.0e6} and full.tune.lr == [1e-3, 2e-3, 4e-3]
    spec = load_spec(path, quick=True)
    assert spec.budget.to_dict() == experiment.QUICK_BUDGET == {"tokens": 4096}
    assert spec.tune.lr == [1e-3, 4e-3] and spec.tune.max_extend == 0
    assert spec.seeds == [0] and spec.ceg.seeds == [0]
    assert len(spec.quick_defaults) == 3 and "budget {'tokens': 1000000.0} -> {'tokens': 4096}" in \
        spec.quick_defaults
    # a quick: block's own keys win; only the keys it leaves out shrink by default
    path = _write_spec(tmp_path, budget={"tokens": 1.0e6}, tune={"lr": [1e-3, 2e-3, 4e-3]},
                       quick={"budget": {"tokens": 2048}})
    spec = load_spec(path, quick=True)
    assert spec.budget.to_dict() == {"tokens": 2048} and spec.tune.lr == [1e-3, 4e-3]
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "budget -> {tokens: 4096}" in " ".join(capsys.readouterr().out.split())


def test_a_quick_budget_keeps_the_specs_comparison_at_equal_flops(tmp_path):
    """A spec at equal FLOPs whose quick: block gives tokens trains its quick runs at equal FLOPs too: the
    tokens of the reference arm, in FLOPs (a MoE arm with more FLOPs per token trains fewer tokens)."""
    from archlab.config import load_recipe, model_config
    from archlab.costs import training_flops_per_token

    arms = [{"name": "dense", "recipe": "recipes/llama/tiny.yaml"},
            {"name": "moe", "recipe": "recipes/mixtral/tiny.yaml"}]
    spec = load_spec(_write_spec(tmp_path, budget={"flops": 4.2e12}, arms=arms,
                                 quick={"budget": {"tokens": 2048}}), quick=True)
    ref = next(a for a in resolve_arms(spec) if a.name == "dense")
    cfg = load_recipe(ref.recipe, ref.overrides)
    fpt = training_flops_per_token(model_config(cfg), int(cfg.train.seq_len))
    assert spec.budget.kind == "flops" and spec.budget.value == pytest.approx(2048 * fpt, rel=1e-3)
    assert any("equal training FLOPs" in line for line in spec.quick_defaults)
    # without a quick: budget the default tokens become FLOPs as well; a tokens spec stays at tokens
    spec = load_spec(_write_spec(tmp_path, budget={"flops": 4.2e12}, arms=arms), quick=True)
    assert spec.budget.kind == "flops" and spec.budget.value == pytest.approx(4096 * fpt, rel=1e-3)
    assert load_spec(_write_spec(tmp_path, arms=arms), quick=True).budget.to_dict() == {"tokens": 4096}


def test_the_report_lists_every_excluded_run_and_why():
    from types import SimpleNamespace

    from analysis.experiment_report import excluded_runs, excluded_table

    row = {"reason": "", "val_loss": 4.0, "unigram_entropy": 6.0, "learned": True, "status": "finished"}
    ctx = SimpleNamespace(
        rows=[{**row, "point": "a-seed0", "arm": "a", "seed": 0},
              {**row, "point": "a-seed1", "arm": "a", "seed": 1, "status": "failed", "reason": "exit 1"}],
        curve_rows=[{**row, "point": "trunk", "arm": "a", "seed": 0, "role": "ceg-stable", "learned": False},
                    {**row, "point": "b025", "arm": "a", "seed": 0, "role": "ceg-cooldown", "val_loss": 5.95,
                     "learned": False},
                    {**row, "point": "b1", "arm": "a", "seed": 0, "role": "ceg-cooldown"}],
        record={"tuning": {"a": {"runs": ["a-lr1", "a-lr2"], "lrs": [1e-3, 1e-2], "diverged": [False, True],
                                 "did_not_learn": [False, False]}}})
    out = {r["run"]: r for r in excluded_runs(ctx)}
    assert set(out) == {"a-seed1", "b025", "a-lr2"}  # the trunk is not a curve point: not excluded, by design
    assert out["a-seed1"]["why"].startswith("failed (exit 1): not in the loss table")
    assert "near-unigram: final loss 5.950 is not 0.1 nats below the unigram entropy 6.000 (only 0.050 nats " \
        "below it)" in out["b025"]["why"]
    assert out["a-lr2"]["why"].startswith("diverged at lr 0.01: scored as the worst lr")
    assert "`b025`" in excluded_table(ctx)
    assert excluded_table(SimpleNamespace(rows=[], curve_rows=[], record={})).startswith("None")


def test_the_plans_estimate_counts_each_runs_measured_overhead(tmp_path, monkeypatch):
    """A quick run's time is mostly start-up and evaluation: the estimate adds the measured seconds a run costs
    beyond its steps to the FLOPs' time, and prints '<1 CPU-min' rather than '~0'."""
    plan_mod = importlib.import_module("tools.experiment.plan")  # the module, not the package's plan()

    monkeypatch.setattr(plan_mod, "_flops_per_s", lambda arm: 1e9)
    monkeypatch.setattr(plan_mod, "run_overhead", lambda arm, speed: 6.0)
    spec = replace(load_spec(_write_spec(tmp_path, ceg={"fractions": [0.25, 0.5, 1.0, 2.0]}), quick=True),
                   out=str(tmp_path / "out"))
    lines = []
    out = plan_mod.plan(spec, log=lines.append)
    for o in out["stages"].values():
        assert o["cpu_s"] == pytest.approx(o["runs"] * 6.0 + o["flops"] / 1e9)
    text = "\n".join(lines)
    assert "~0 CPU-min" not in text and "<1 CPU-min" in text and "6.0 s a run of start-up" in text
    assert [plan_mod.cpu_minutes(s) for s in (30, 99, 1200)] == ["<1", "~1.6", "~20"]


def _help_examples(doc: str, module: str) -> list[list[str]]:
    """The argument lists of the ``python -m <module>`` commands in a help text (comments dropped)."""
    import shlex

    lines = [ln.split("#", 1)[0].strip() for ln in doc.replace("\\\n", " ").splitlines()]
    return [shlex.split(ln)[3:] for ln in lines if ln.startswith(f"python -m {module} ")]


@pytest.mark.slow
def test_every_help_example_plans_without_a_refusal(tmp_path):
    """Each spec the help's examples name loads and plans (with --quick where the example has it): the help
    shows no command that the tool would refuse."""
    from tools.experiment import cli

    examples = _help_examples(cli.__doc__, "tools.experiment")
    assert len(examples) >= 5 and ["run", "experiments/evolution.yaml", "--quick"] in examples
    for spec_path, quick in dict.fromkeys((a[1], "--quick" in a) for a in examples):
        spec = replace(load_spec(spec_path, quick=quick), out=str(tmp_path / "out"))
        out = experiment.plan(spec, log=lambda *a: None, estimate=False)
        assert out["stages"]["seeded runs"]["runs"] > 0
