"""analysis.scaling: the L(C) fit on synthetic points, and the program on small real runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analysis.runs import RunError, expand_inputs, open_run
from analysis.scaling import analyse, envelope, fit_power_law, main, pareto_frontier

C_GRID = np.logspace(12, 16, 8)


def law(C, E=2.0, A_ref=30.0, alpha=0.25, c0=1e12):
    return E + A_ref * (np.asarray(C) / c0) ** (-alpha)


# ------------------------------------------------------------------ the fit


def test_fit_recovers_noiseless_parameters():
    f = fit_power_law(C_GRID, law(C_GRID), n_boot=0)
    assert f.status == "ok"
    assert f.E == pytest.approx(2.0, rel=1e-3)
    assert f.alpha == pytest.approx(0.25, rel=1e-3)
    assert f.A == pytest.approx(30.0 * 1e12 ** 0.25, rel=1e-2)  # A for C in FLOPs
    np.testing.assert_allclose(f.predict(C_GRID), law(C_GRID), rtol=1e-4)


def test_huber_fit_resists_an_outlier_that_pulls_plain_least_squares():
    L = law(C_GRID)
    L[3] *= 1.25  # one bad point
    robust = fit_power_law(C_GRID, L, n_boot=0, huber_delta=1e-3)
    plain = fit_power_law(C_GRID, L, n_boot=0, huber_delta=10.0)  # Huber with a huge delta = least squares
    assert abs(robust.alpha - 0.25) < 0.01 and abs(robust.E - 2.0) < 0.05
    assert abs(plain.E - 2.0) > 10 * abs(robust.E - 2.0)


def test_bootstrap_intervals_cover_the_truth_on_noisy_points():
    rng = np.random.default_rng(0)
    L = law(C_GRID) * np.exp(rng.normal(0, 0.01, len(C_GRID)))
    f = fit_power_law(C_GRID, L, n_boot=150, seed=0)
    assert f.n_boot > 100
    lo, hi = f.ci["alpha"]
    assert lo < 0.25 < hi and hi - lo < 0.1
    lo, hi = f.ci["E"]
    assert lo < 2.0 < hi
    band = f.band(C_GRID)
    assert band is not None
    assert np.all(band[0] <= f.predict(C_GRID) + 1e-9) and np.all(band[1] >= f.predict(C_GRID) - 1e-9)


def test_few_points_bootstrap_residuals_not_repeated_point_sets():
    rng = np.random.default_rng(1)
    C = C_GRID[::2]  # 4 points: resampled point sets would almost always be the original four
    L = law(C) * np.exp(rng.normal(0, 0.01, len(C)))
    f = fit_power_law(C, L, n_boot=60, seed=0)
    assert f.ci_method == "residuals" and f.n_boot >= 50
    lo, hi = f.ci["alpha"]
    assert lo < f.alpha < hi and hi - lo > 1e-3  # a real interval, not a single repeated fit


def test_points_on_a_straight_log_log_line_still_fit():
    """Losses that fall on a line in log-log leave E undetermined (a flat E-A valley); the fit
    must still follow the points instead of stopping at a flat curve."""
    C = np.array([1.31e10, 2.19e10, 4.03e10, 9.06e10])
    L = np.array([7.2443, 7.0907, 6.9200, 6.6898])
    f = fit_power_law(C, L, n_boot=0)
    assert f.status == "ok" and f.rms_log_residual < 1e-3
    np.testing.assert_allclose(f.predict(C), L, rtol=2e-3)


def test_three_points_are_under_determined():
    f = fit_power_law(C_GRID[:3], law(C_GRID[:3]))
    assert f.status == "under-determined" and f.E is None and ">= 4" in f.message
    with pytest.raises(ValueError, match="no fitted curve"):
        f.predict(1e13)
    # four points but only three distinct compute values: still under-determined
    C = np.array([1e12, 1e13, 1e14, 1e14])
    assert fit_power_law(C, law(C)).status == "under-determined"


def test_fit_rejects_non_positive_or_non_finite_points():
    with pytest.raises(ValueError, match="finite and positive"):
        fit_power_law([1e12, 1e13, -1.0, 1e15], [3.0, 2.5, 2.2, 2.1])
    with pytest.raises(ValueError, match="finite and positive"):
        fit_power_law([1e12, 1e13, 1e14, 1e15], [3.0, float("nan"), 2.2, 2.1])


def test_pareto_frontier_keeps_only_compute_optimal_points():
    C = [1, 2, 3, 4, 5]
    L = [5.0, 4.0, 4.5, 3.0, 3.5]
    assert pareto_frontier(C, L).tolist() == [0, 1, 3]


def test_envelope_is_the_lowest_loss_within_each_budget():
    curves = [("small", None, np.array([1.0, 2.0, 4.0]), np.array([5.0, 4.0, 3.6])),
              ("big", None, np.array([2.0, 4.0, 8.0]), np.array([4.5, 3.5, 3.0]))]
    C, L, who = envelope(curves, n=4)  # grid 1, 2, 4, 8
    np.testing.assert_allclose(C, [1, 2, 4, 8])
    np.testing.assert_allclose(L, [5.0, 4.0, 3.5, 3.0])
    assert who == ["small", "small", "big", "big"]


# ------------------------------------------------------------------ run folders


def test_run_status_of_finished_diverged_and_killed_runs(analysis_runs):
    assert open_run(analysis_runs["dense-d32"]).status == "finished"
    d = open_run(analysis_runs["diverged"])
    assert d.status == "diverged" and "non-finite" in d.reason
    k = open_run(analysis_runs["killed"])
    assert k.status == "incomplete" and "summary.json" in k.reason


def test_expand_inputs_reads_folders_of_runs_and_globs(analysis_runs):
    root = analysis_runs["dense-d16"].parent
    runs, problems = expand_inputs([str(root)])
    assert {r.name for r in runs} >= {"dense-d16", "mixtral-d32", "diverged", "killed"}
    runs, _ = expand_inputs([str(root / "dense-*")])
    assert sorted(r.name for r in runs) == ["dense-d16", "dense-d24", "dense-d32", "dense-d48"]


def test_scaling_program_on_real_runs(analysis_runs, tmp_path):
    root = analysis_runs["dense-d16"].parent
    result = analyse([str(root)], tmp_path, n_boot=30)
    fams = result["families"]
    dense = fams["dense"]
    assert dense["status"] == "ok" and dense["n_points"] == 4  # diverged and killed runs left out
    # each point's compute is its tokens times the cost model's training FLOPs per token
    for p in dense["points"]:
        summary = json.loads((root / p["run"] / "summary.json").read_text())
        assert p["flops"] == pytest.approx(summary["training_flops"], rel=1e-9)
        assert p["loss"] == pytest.approx(summary["final_val_loss"]["32"])
    assert fams["mixtral"]["status"] == "under-determined"
    excluded = {e["run"].split("/")[-1]: e for e in result["excluded"]}
    assert excluded["diverged"]["status"] == "diverged" and excluded["killed"]["status"] == "incomplete"
    # MoE vs dense at equal active parameters (same tokens): interpolated between dense runs
    moe = {r["run"]: r for r in result["dense_vs_moe"]}
    assert set(moe) == {"mixtral-d32", "deepseek-d32"}
    for r in moe.values():
        if "dense" in r["equal_active_params"]:
            d = r["equal_active_params"]["dense"]
            assert d["moe_minus_dense"] == pytest.approx(r["loss"] - d["loss"])
    for name in ("loss_vs_flops.png", "loss_vs_tokens.png", "dense_vs_moe.png", "fits.json", "fits.md"):
        assert (tmp_path / name).stat().st_size > 1000 or name.endswith((".json", ".md"))
    saved = json.loads((tmp_path / "fits.json").read_text())
    assert saved["families"]["dense"]["alpha"] == pytest.approx(dense["alpha"])
    assert "| dense | 4 |" in (tmp_path / "fits.md").read_text()


def test_cli_prints_the_table_and_fails_clearly(analysis_runs, tmp_path, capsys):
    root = analysis_runs["dense-d16"].parent
    assert main([str(root / "dense-*"), "--bootstrap", "0"]) == 0
    assert "## Fitted L(C)" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    (tmp_path / "notarun").mkdir()
    assert main([str(tmp_path / "notarun")]) == 2
    assert "not an archlab run folder" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing-*")]) == 2
    assert "matches nothing" in capsys.readouterr().err
    assert main([str(analysis_runs["killed"]), str(analysis_runs["diverged"])]) == 2
    err = capsys.readouterr().err
    assert "no finished run" in err and "diverged" in err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0


def test_run_error_is_a_value_error():
    assert issubclass(RunError, ValueError)
