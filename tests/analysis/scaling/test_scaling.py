"""analysis.scaling: the L(C) and L(N, D) fits, IsoFLOP profiles, the envelope exponent and seed noise on
synthetic points, and the program on small real runs and on fake run folders of a synthetic sweep."""

from __future__ import annotations

import json

import numpy as np
import pytest

import analysis.scaling.plots as plots
from analysis.runs import RunError, expand_inputs, open_run
from analysis.scaling.cli import main
from analysis.scaling.fits.common import group_budgets
from analysis.scaling.fits.envelope import envelope, envelope_exponent, pareto_frontier
from analysis.scaling.fits.isoflop import fit_isoflop_profile, isoflop_profiles
from analysis.scaling.fits.log_log import fit_log_log
from analysis.scaling.fits.loss_nd import compute_optimal, fit_loss_nd
from analysis.scaling.fits.noise import pooled_std
from analysis.scaling.fits.power_law import fit_power_law
from analysis.scaling.read import average_seeds, collect, n_params
from analysis.scaling.report import analyse
from analysis.scaling.study import family_design_noise

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


def test_scaling_program_on_real_runs(analysis_runs, tmp_path, monkeypatch):
    root = analysis_runs["dense-d16"].parent
    with pytest.raises(RunError, match="not 0.1 nats below the training split's unigram entropy"):
        analyse([str(root)], None, n_boot=0)  # 20 steps: no run got below token frequencies
    monkeypatch.chdir(root.parent)  # the report names runs as seen from the working folder
    result = analyse([str(root)], tmp_path, n_boot=30, keep_unlearned=True)  # kept as points, said so
    assert {e["status"] for e in result["excluded"]} == {"near-unigram (kept)", "diverged", "incomplete"}
    assert {e["run"] for e in result["excluded"]} >= {f"{root.name}/diverged", f"{root.name}/killed"}
    fams = result["families"]
    dense = fams["dense"]
    assert dense["E"] is not None and dense["n_points"] == 4  # fitted; diverged and killed runs left out
    # 4 points of 20-step runs: what an interval reaches an optimiser bound says so by name, never "ok"
    assert dense["status"] == ("; ".join(dense["flags"]) if dense["flags"] else "ok")
    assert all(f.startswith("interval at bound (") for f in dense["flags"])
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
    assert main([str(root / "dense-*"), "--bootstrap", "0", "--keep-unlearned"]) == 0
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


# ------------------------------------------------------------------ L(N, D): Chinchilla approach 3

TRUE = {"E": 1.7, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28}
A_OPT = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])  # 0.4516: N_opt ∝ C^a
G_TRUE = (TRUE["alpha"] * TRUE["A"] / (TRUE["beta"] * TRUE["B"])) ** (1 / (TRUE["alpha"] + TRUE["beta"]))


def chinchilla(N, D, E=1.7, A=400.0, alpha=0.34, B=410.0, beta=0.28):
    return E + A * np.asarray(N, dtype=float) ** (-alpha) + B * np.asarray(D, dtype=float) ** (-beta)


def nd_grid(n_sizes=7, n_tokens=7):
    N, D = np.meshgrid(np.geomspace(1e5, 1e8, n_sizes), np.geomspace(1e6, 1e10, n_tokens))
    return N.ravel(), D.ravel()


def test_loss_nd_recovers_noiseless_parameters():
    N, D = nd_grid()
    f = fit_loss_nd(N, D, chinchilla(N, D), n_boot=0)
    assert f.status == "ok" and f.n_points == 49 and f.n_sizes == 7 and f.n_token_counts == 7
    for name, value in TRUE.items():
        assert getattr(f, name) == pytest.approx(value, rel=1e-3), name
    assert f.log_A == pytest.approx(np.log(400.0), rel=1e-3) and f.a_opt == pytest.approx(A_OPT, rel=1e-3)
    np.testing.assert_allclose(f.predict(N, D), chinchilla(N, D), rtol=1e-6)


def test_loss_nd_intervals_cover_the_truth_with_one_percent_noise():
    N, D = nd_grid()
    L = chinchilla(N, D) * np.exp(np.random.default_rng(3).normal(0, 0.01, len(N)))
    f = fit_loss_nd(N, D, L, n_boot=80, seed=0)
    assert f.status == "ok" and f.ci_method == "points" and f.n_boot >= 70
    for name, value in {**TRUE, "a_opt": A_OPT}.items():
        lo, hi = f.ci[name]
        assert lo < value < hi, (name, getattr(f, name), f.ci[name])
    # and not absurdly wide
    assert f.ci["alpha"][1] - f.ci["alpha"][0] < 0.06 and f.ci["beta"][1] - f.ci["beta"][0] < 0.06
    assert f.ci["E"][1] - f.ci["E"][0] < 0.5 and f.ci["a_opt"][1] - f.ci["a_opt"][0] < 0.06
    assert f.ci["A"][1] / f.ci["A"][0] < 2.0 and f.ci["B"][1] / f.ci["B"][0] < 2.0


def test_loss_nd_few_points_bootstrap_residuals():
    N, D = nd_grid(3, 3)  # 9 points: resampled point sets would rarely keep 3 sizes and 3 token counts
    L = chinchilla(N, D) * np.exp(np.random.default_rng(1).normal(0, 0.01, len(N)))
    f = fit_loss_nd(N, D, L, n_boot=30, seed=0)
    assert f.status == "ok" and f.ci_method == "residuals" and f.n_boot >= 25
    lo, hi = f.ci["alpha"]
    assert lo <= f.alpha <= hi and hi - lo > 1e-3


def test_loss_nd_degenerate_inputs_give_a_status_not_an_exception():
    N, D = nd_grid()
    L = chinchilla(N, D)
    cases = {
        "one-model-size": (np.full(6, 1e6), np.geomspace(1e6, 1e9, 6)),
        "one-token-count": (np.geomspace(1e5, 1e8, 6), np.full(6, 1e8)),
        "too-few-points": (N[[0, 8, 16, 24, 32]], D[[0, 9, 16, 24, 32]]),
        "too-few-model-sizes": (np.repeat([1e5, 1e6], 4), np.tile(np.geomspace(1e6, 1e9, 4), 2)),
        "n-d-collinear": (np.geomspace(1e5, 1e8, 8), 1e18 / (6 * np.geomspace(1e5, 1e8, 8))),  # one budget
    }
    for status, (n, d) in cases.items():
        f = fit_loss_nd(n, d, chinchilla(n, d), n_boot=5)
        assert f.status == status and f.E is None and f.message, (status, f.status, f.message)
        with pytest.raises(ValueError, match="no fitted L"):
            f.predict(1e6, 1e9)
        opt = compute_optimal(f, 1e20)
        assert opt.status == status and opt.N_opt is None
    f = fit_loss_nd(N, D, np.full_like(L, np.nan), n_boot=5)
    assert f.status == "no-finite-points" and f.n_dropped == len(N)
    L_bad = L.copy()
    L_bad[[0, 10]] = [np.nan, np.inf]
    f = fit_loss_nd(N, D, L_bad, n_boot=0)
    assert f.status == "ok" and f.n_dropped == 2 and "2 non-finite" in f.message
    assert f.alpha == pytest.approx(0.34, rel=1e-3)


def test_compute_optimal_is_the_minimum_of_the_fit_at_fixed_compute():
    N, D = nd_grid()
    f = fit_loss_nd(N, D, chinchilla(N, D), n_boot=0)
    C, k = 1e21, 6.0
    opt = compute_optimal(f, C, k)
    assert opt.status == "ok" and opt.a == pytest.approx(A_OPT, rel=1e-3)
    assert opt.b == pytest.approx(1 - A_OPT, rel=1e-3)
    assert opt.N_opt == pytest.approx(G_TRUE * (C / 6) ** A_OPT, rel=1e-2)
    assert k * opt.N_opt * opt.D_opt == pytest.approx(C, rel=1e-9)
    assert opt.tokens_per_param == pytest.approx(opt.D_opt / opt.N_opt)
    grid = np.geomspace(opt.N_opt / 10, opt.N_opt * 10, 4001)  # brute force along C = k N D
    loss = f.predict(grid, C / (k * grid))
    assert grid[np.argmin(loss)] == pytest.approx(opt.N_opt, rel=3e-3)
    assert opt.L_opt == pytest.approx(loss.min(), rel=1e-6)
    # a larger k means fewer parameter-tokens for the same FLOPs: C/k is what matters
    assert compute_optimal(f, 2 * C, 2 * k).N_opt == pytest.approx(opt.N_opt, rel=1e-9)


# ------------------------------------------------------------------ IsoFLOP profiles: approach 2


def isoflop_points(rng=None, budgets=np.geomspace(1e15, 1e18, 5), n_sizes=9, noise=0.01, shifts=None):
    """Per budget, sizes spaced in log N around the true optimum (+-0.7 decades, moved by ``shifts``
    decades per budget), D = C / (6 N)."""
    N, C = [], []
    for c, shift in zip(budgets, shifts if shifts is not None else np.zeros(len(budgets))):
        for n in G_TRUE * (c / 6) ** A_OPT * np.geomspace(10 ** (shift - 0.7), 10 ** (shift + 0.7), n_sizes):
            N.append(n)
            C.append(c)
    N, C = np.array(N), np.array(C)
    L = chinchilla(N, C / (6 * N))
    if rng is not None:
        L = L * np.exp(rng.normal(0, noise, len(L)))
    return N, C, L


def test_isoflop_recovers_the_compute_optimal_exponent():
    N, C, L = isoflop_points()
    exact = isoflop_profiles(N, C, L, n_boot=50)
    assert exact.status == "ok" and [p.status for p in exact.profiles] == ["ok"] * 5
    assert exact.power_law.slope == pytest.approx(A_OPT, rel=1e-6)  # the parabola's bias is the same at every C
    # sizes off-centre by -0.3..+0.3 decades: the minima follow the true optimum, not the sizes' centre
    shifted = isoflop_profiles(*isoflop_points(shifts=np.linspace(-0.3, 0.3, 5)), n_boot=0)
    for p in shifted.profiles:
        assert p.N_opt == pytest.approx(G_TRUE * (p.budget / 6) ** A_OPT, rel=0.1)
    assert shifted.power_law.slope == pytest.approx(A_OPT, abs=0.01)
    rng = np.random.default_rng(0)
    N, C, L = isoflop_points(rng)
    res = isoflop_profiles(N, C * (1 + rng.uniform(0, 0.05, len(C))), L, n_boot=200, seed=0)  # FLOPs within 5%
    assert len(res.profiles) == 5 and all(p.n_points == 9 and p.ci_method == "points" for p in res.profiles)
    pl = res.power_law
    lo, hi = pl.ci["slope"]
    assert pl.ci_method == "per-point samples" and lo < A_OPT < hi and hi - lo < 0.15
    truth = [G_TRUE * (p.budget / 6) ** A_OPT * 1.02 for p in res.profiles]  # 1.02: the parabola's own bias
    covered = [p.ci["N_opt"][0] < t < p.ci["N_opt"][1] for p, t in zip(res.profiles, truth)]
    assert sum(covered) >= 4, covered  # 95% intervals: all five cover with probability 0.77


def test_isoflop_degenerate_budgets_are_reported():
    N, C, L = isoflop_points()
    keep = np.ones(len(N), dtype=bool)
    keep[9:16] = False  # the second budget keeps two sizes
    res = isoflop_profiles(N[keep], C[keep], L[keep], n_boot=20)
    assert [p.status for p in res.profiles] == ["ok", "too-few-model-sizes", "ok", "ok", "ok"]
    assert res.status == "ok" and "1 of 5 budgets left out" in res.message
    one = isoflop_profiles(N[:9], C[:9], L[:9], n_boot=20)
    assert one.status == "one-budget" and one.power_law.status == "one-budget"
    # loss still falling at the largest size: the minimum is outside the sampled sizes
    prof = fit_isoflop_profile(N[:4], L[:4], budget=C[0], n_boot=20)
    assert prof.status == "minimum-outside-sampled-range" and not prof.bracketed
    flat = fit_isoflop_profile([1e5, 1e6, 1e7, 1e8], [3.0, 2.9, 2.7, 2.3], budget=1e18, n_boot=20)
    assert flat.status == "not-convex" and flat.N_opt is None
    none = isoflop_profiles(N[[0, 9, 18]], C[[0, 9, 18]], L[[0, 9, 18]])
    assert none.status == "no-usable-budget" and "3 too-few-model-sizes" in none.message
    three = fit_isoflop_profile(N[3:6], L[3:6], budget=C[0], n_boot=40)  # an exact parabola: no interval
    assert three.status == "ok" and not three.ci and "no interval" in three.message
    three = fit_isoflop_profile(N[3:6], L[3:6], budget=C[0], n_boot=40, point_sem=[0.01] * 3)
    assert three.ci_method.startswith("parametric") and three.ci["N_opt"][0] < three.N_opt < three.ci["N_opt"][1]


def test_group_budgets_by_tolerance_or_tag():
    C = [1.0e12, 1.05e12, 3e12, 3.2e12, 1e13, 1.3e13]
    assert [g.tolist() for g in group_budgets(C, tolerance=0.1)] == [[0, 1], [2, 3], [4], [5]]
    tags = [1e12, 1e12, 3e12, 3e12, 1e13, 1e13]  # the sweep's budgets win over the tolerance
    assert [g.tolist() for g in group_budgets(C, tolerance=0.1, tags=tags)] == [[0, 1], [2, 3], [4, 5]]


def test_fit_log_log_intervals_and_statuses():
    x = np.geomspace(1e15, 1e19, 6)
    y = 3.0 * x ** 0.5 * np.exp(np.random.default_rng(0).normal(0, 0.05, 6))
    f = fit_log_log(x, y, n_boot=100)
    assert f.ci_method == "residuals" and f.ci["slope"][0] < 0.5 < f.ci["slope"][1]
    assert fit_log_log(x[:1], y[:1], what="budgets").status == "one-budget"
    two = fit_log_log(x[:2], y[:2])
    assert two.status == "ok" and not two.ci and "no interval" in two.message


# ------------------------------------------------------------------ approach 1: the envelope


def training_curves(sizes, d_max=3e10, n_eval=24):
    """Validation curves of runs of each size as if every prefix were a trained run: L(N, t)."""
    curves = []
    for n in sizes:
        t = np.geomspace(1e6, d_max, n_eval)
        curves.append((f"n{n:.3g}", t, 6 * n * t, chinchilla(n, t)))
    return curves, {f"n{n:.3g}": n for n in sizes}


def test_envelope_exponent_follows_the_optimal_size():
    curves, sizes = training_curves(np.geomspace(1e5, 1e9, 17))
    e = envelope_exponent(curves, sizes, n_grid=80, n_boot=40)
    assert e.status == "ok" and e.n_sizes >= 5
    assert e.slope == pytest.approx(A_OPT, abs=0.03) and e.ci["slope"][0] <= e.slope <= e.ci["slope"][1]
    one = envelope_exponent(curves[:1], sizes)
    assert one.status == "one-model-size"
    two = envelope_exponent(curves[:2], sizes)  # both sizes are extremes: nothing left after trimming
    assert two.status == "too-few-model-sizes"


# ------------------------------------------------------------------ seed noise


def test_pooled_std_recovers_the_injected_seed_noise():
    rng = np.random.default_rng(0)
    groups = [2.0 + i * 0.1 + rng.normal(0, 0.02, 4) for i in range(40)]
    nf = pooled_std(groups + [[3.0]])  # a single-seed point adds nothing
    assert nf.status == "ok" and nf.n_groups == 40 and nf.dof == 120 and nf.n_runs == 161
    assert nf.std == pytest.approx(0.02, rel=0.15)
    assert pooled_std([[3.0], [2.5]]).status == "no-seed-groups"
    assert pooled_std([[3.0, np.nan, 3.2]]).std == pytest.approx(np.std([3.0, 3.2], ddof=1))


# ------------------------------------------------------------------ fake run folders of a synthetic sweep

SWEEP_LAW = {"E": 1.7, "A": 40.0, "alpha": 0.34, "B": 60.0, "beta": 0.28}  # minima inside the sizes below
SIZES = {"d32": [32, 1], "d48": [48, 2], "d64": [64, 2], "d96": [96, 3], "d128": [128, 4], "d192": [192, 4],
         "d256": [256, 6]}
BUDGETS = [1e12, 1e13, 1e14]
SEED_STD = 0.01  # seeds 1 and 2 of the 1e13 budget at loss -+SEED_STD: the std of each seed group


@pytest.fixture(scope="module")
def fake_sweep(tmp_path_factory, fake_run):
    """A FLOPs sweep as fake run folders with a manifest: dense, 7 sizes x 3 budgets, losses from
    SWEEP_LAW (N = non-embedding parameters), three seeds at the middle budget; a Mixtral family
    of one size; a diverged run."""
    root = tmp_path_factory.mktemp("fake-sweep")
    common = ["model.vocab_size=512"]
    points = []

    def add(name, recipe, overrides, C, loss_of, status="completed", budget=True):
        from analysis.runs import open_run

        probe = fake_run(root / name, recipe, overrides, tokens=1.0, loss=1.0)
        r = open_run(probe)
        D = C / r.flops_per_token
        N = r.params["non_embedding"]
        L = loss_of(N, D)
        curve = [(t, loss_of(N, t)) for t in np.geomspace(D / 30, D, 6)]
        fake_run(root / name, recipe, overrides, tokens=D, loss=L, curve=curve, status=status)
        if budget:
            points.append({"name": name, "run_dir": name, "budget_kind": "flops", "budget": C})

    for C in BUDGETS:
        for size, (d, n_layers) in SIZES.items():
            ov = common + [f"model.d_model={d}", f"model.n_layers={n_layers}"]
            add(f"dense-{size}-flop{C:.0e}", "recipes/dense/tiny.yaml", ov, C,
                lambda N, D: chinchilla(N, D, **SWEEP_LAW))
            if C == 1e13:
                for seed, sign in ((1, -1), (2, 1)):
                    add(f"dense-{size}-flop{C:.0e}-seed{seed}", "recipes/dense/tiny.yaml", ov + [f"train.seed={seed}"],
                        C, lambda N, D, s=sign: chinchilla(N, D, **SWEEP_LAW) + s * SEED_STD)
        add(f"mixtral-s1-flop{C:.0e}", "recipes/mixtral/tiny.yaml", common, C,
            lambda N, D: chinchilla(N, D, **SWEEP_LAW) - 0.05)
    add("dense-diverged", "recipes/dense/tiny.yaml", common + ["train.lr=10.0"], 1e13,
        lambda N, D: float("nan"), status="nonfinite")
    (root / "manifest.json").write_text(json.dumps({"kind": "archlab-sweep", "version": 1, "points": points}))
    return root


def test_a_sweeps_points_still_to_train_are_one_problem(fake_sweep, tmp_path):
    """A sweep folder part-trained (or an archive of part of a study) lists its missing points once, by count."""
    listed = json.loads((fake_sweep / "manifest.json").read_text())["points"]
    points = [{**q, "run_dir": str(fake_sweep / q["run_dir"])} for q in listed[:4]]
    points += [{"name": f"later-{i}", "run_dir": f"later-{i}", "status": "not archived"} for i in range(5)]
    (tmp_path / "manifest.json").write_text(json.dumps({"kind": "archlab-sweep", "version": 1, "points": points}))
    runs, problems = expand_inputs([str(tmp_path)])
    assert len(runs) == 4
    assert problems == [(str(tmp_path.resolve()), "5 of the sweep's 9 planned points have no run folder (not trained, "
                                                  "or not archived): later-0, later-1, later-2, ...")]


def test_seed_runs_are_one_point_at_their_mean(fake_sweep):
    runs, _ = expand_inputs([str(fake_sweep)])
    pts, excluded, curves = collect(runs)
    assert [e["status"] for e in excluded] == ["diverged"]
    assert len(pts) == 7 * 3 + 7 * 2 + 3
    avg, avg_curves, losses = average_seeds(pts, curves)
    assert len(avg) == 7 * 3 + 3
    seeded = [p for p in avg if p.n_seeds > 1]
    assert len(seeded) == 7 and all(p.n_seeds == 3 and p.seed == 0 for p in seeded)
    for p in seeded:
        truth = chinchilla(n_params(p, "non_embedding"), p.tokens, **SWEEP_LAW)
        assert p.loss == pytest.approx(truth, rel=1e-9) and p.loss_std == pytest.approx(SEED_STD, rel=1e-6)
        assert p.budget == 1e13 and len(p.seed_runs) == 3
    assert pooled_std(losses["dense"]).std == pytest.approx(SEED_STD, rel=1e-6)
    # the designer's noise from the first two seeds (each point its own unit: no trunk share to measure)
    dn = family_design_noise([p for p in avg if p.family == "dense"])
    assert dn.n_pairs == 7 and dn.trunk_share is None
    assert dn.sigma == pytest.approx(np.sqrt(np.mean([np.log(p.seed_losses[1] / p.seed_losses[0]) ** 2
                                                      for p in seeded]) / 2), rel=1e-9)
    assert len(avg_curves["dense"]) == 21  # seeds' curves averaged into one
    moe = next(p for p in avg if p.family == "mixtral")
    assert n_params(moe, "active") < n_params(moe, "non_embedding") < n_params(moe, "total")


def test_seed_groups_ignore_bookkeeping_and_a_stable_trunk_is_no_point(fake_run, tmp_path):
    base = ["model.vocab_size=512", "model.d_model=32", "model.n_layers=1"]
    fake_run(tmp_path / "a", "recipes/dense/tiny.yaml", base + ["train.seed=1", "train.log_every=3"], tokens=1e6,
             loss=3.0)
    fake_run(tmp_path / "b", "recipes/dense/tiny.yaml", base + ["train.seed=2", "train.run_name=other"], tokens=1e6,
             loss=3.2)
    fake_run(tmp_path / "lr", "recipes/dense/tiny.yaml", base + ["train.lr=1e-3"], tokens=1e6, loss=3.1)
    fake_run(tmp_path / "trunk", "recipes/dense/tiny.yaml", base + ["train.schedule=constant"], tokens=1e6, loss=3.3,
             summary_extra={"role": "stable"})
    runs, _ = expand_inputs([str(tmp_path)])
    pts, excluded, curves = collect(runs)
    assert [(e["run"].split("/")[-1], e["status"]) for e in excluded] == [("trunk", "not-a-scaling-point")]
    avg, _, losses = average_seeds(pts, curves)
    assert sorted((p.run, p.n_seeds) for p in avg) == [("a", 2), ("lr", 1)]  # another lr is another point
    assert next(p for p in avg if p.run == "a").loss == pytest.approx(3.1)
    assert pooled_std(losses["dense"]).std == pytest.approx(np.std([3.0, 3.2], ddof=1))


def test_a_run_near_the_unigram_entropy_is_left_out_with_a_status(fake_run, tmp_path):
    # 0.05 nats under the unigram entropy: it learned token frequencies only, not a scaling point; 0.2 under is one
    common = ["model.vocab_size=512"]
    fake_run(tmp_path / "near", "recipes/dense/tiny.yaml", common, tokens=1e5, loss=5.95,
             summary_extra={"unigram_entropy_train": 6.0})
    fake_run(tmp_path / "learned", "recipes/dense/tiny.yaml", common + ["train.seed=3"], tokens=2e5, loss=5.8,
             summary_extra={"unigram_entropy_train": 6.0})
    runs, _ = expand_inputs([str(tmp_path / "near"), str(tmp_path / "learned")])
    pts, excluded, _ = collect(runs)
    assert [p.run for p in pts] == ["learned"]
    assert [(e["run"].split("/")[-1], e["status"]) for e in excluded] == [("near", "near-unigram")]
    assert "5.950 is not 0.1 nats below the training split's unigram entropy 6.000" in excluded[0]["reason"]


def test_cli_writes_isoflop_loss_nd_and_the_three_exponents(fake_sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(fake_sweep), "--out", str(out), "--bootstrap", "20", "--n-kind", "non_embedding"]) == 0
    printed = capsys.readouterr().out
    for name in ("loss_vs_flops.png", "loss_vs_tokens.png", "dense_vs_moe.png", "isoflop.png", "loss_nd.png"):
        assert (out / name).stat().st_size > 10_000, name
    saved = json.loads((out / "fits.json").read_text())
    assert saved["n_kind"]["name"] == "non_embedding"
    dense = saved["scaling_nd"]["dense"]
    nd = dense["loss_nd"]
    assert nd["status"] == "ok" and nd["n_points"] == 21  # seed groups averaged
    for name, value in SWEEP_LAW.items():  # the seed means are noiseless
        assert nd[name] == pytest.approx(value, rel=1e-2), name
    assert 6 < dense["k"] < 18 and dense["compute_optimal"]["status"] == "ok"
    # the allocation at each size's own FLOPs per token: F / N at the optimum lies in the sizes' range
    assert dense["k_range"][0] <= dense["compute_optimal"]["k"] <= dense["k_range"][1]
    assert dense["compute_optimal_6nd"]["k"] == 6.0
    iso = dense["isoflop"]
    assert [p["budget"] for p in iso["profiles"]] == BUDGETS  # grouped by the manifest's budgets
    assert [p["status"] for p in iso["profiles"]] == ["ok"] * 3 and iso["power_law"]["status"] == "ok"
    ex = saved["exponents"]["dense"]
    assert set(ex) == {"approach_1_envelope", "approach_2_isoflop", "approach_3_loss_nd"}
    assert ex["approach_3_loss_nd"]["a"] == pytest.approx(0.28 / 0.62, rel=1e-2)
    assert saved["noise"]["overall"]["std"] == pytest.approx(SEED_STD, rel=1e-6)
    # the one-size MoE family: every approach says why it has no answer
    moe = saved["scaling_nd"]["mixtral"]
    assert moe["loss_nd"]["status"] == "one-model-size" and moe["envelope"]["status"] == "one-model-size"
    assert moe["isoflop"]["status"] == "no-usable-budget"
    assert [p["status"] for p in moe["isoflop"]["profiles"]] == ["too-few-model-sizes"] * 3
    md = (out / "fits.md").read_text()
    assert md.strip() == printed.split("\nwrote")[0].strip()
    for heading in ("## Fitted L(N, D)", "## Compute-optimal allocation", "## IsoFLOP profiles",
                    "## Exponent a of N_opt ∝ C^a: three estimates", "## Seed noise"):
        assert heading in md
    assert f"**{SEED_STD:.4f} nats**" in md and "| mixtral | 3 (1 x 3) |" in md and "one-model-size" in md
    assert "dense-diverged: diverged" in md


def test_fitted_curves_stay_inside_the_measured_range(fake_sweep, tmp_path, monkeypatch):
    # a fitted line (100, 80 or 60 points: L(C), the IsoFLOP parabolas and N*(C), L(N, D) per size) spans
    # at most the x range of the points drawn on its own axes: the figures never extrapolate
    figures = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.setdefault(path.name, fig) and path)
    analyse([str(fake_sweep)], tmp_path, n_boot=5)
    checked = 0
    for name in ("loss_vs_flops.png", "isoflop.png", "loss_nd.png"):
        axes = figures[name].axes[:1] if name == "loss_vs_flops.png" else figures[name].axes  # right: curves
        for ax in axes:
            xs = [x for c in ax.collections for x in np.asarray(c.get_offsets())[:, 0]]
            xs += [x for ln in ax.get_lines() if ln.get_linestyle() == "None" for x in ln.get_xdata()]
            for ln in ax.get_lines():
                x = np.asarray(ln.get_xdata(), dtype=float)
                if ln.get_linestyle() == "-" and len(x) in (60, 80, 100) and xs:
                    assert min(xs) * (1 - 1e-9) <= x.min() and x.max() <= max(xs) * (1 + 1e-9), (name, ax.get_title())
                    checked += 1
    assert checked >= 10  # the parabolas of 3 budgets, 7 sizes' L(N, D), L(C), N*(C)


def test_n_kind_selects_the_parameter_count(fake_sweep, tmp_path):
    res = analyse([str(fake_sweep)], None, n_boot=0, n_kind="total")
    st = res["studies"]["dense"]
    runs, _ = expand_inputs([str(fake_sweep / st.runs[0])])
    assert st.N[0] == runs[0].params["total"] and res["n_kind"]["name"] == "total"
    with pytest.raises(SystemExit):
        main([str(fake_sweep), "--n-kind", "bogus"])
    with pytest.raises(ValueError, match="valid are"):
        analyse([str(fake_sweep)], None, n_boot=0, n_kind="bogus")


def test_degenerate_run_sets_report_statuses(fake_sweep, tmp_path):
    # one budget (all sizes at 1e12) and one model size (d64 at every budget): no traceback, statuses
    one_budget = analyse([str(fake_sweep / "dense-*-flop1e+12")], tmp_path / "b", n_boot=5)
    st = one_budget["studies"]["dense"]
    assert st.nd.status == "one-budget" and st.iso.status == "one-budget"
    assert "| dense | 7 (7 x 7) | - | - | - | - | - | - | one-budget: all 7 points share" in \
        one_budget["table_markdown"]
    one_size = analyse([str(fake_sweep / "dense-d64-flop*")], tmp_path / "s", n_boot=5)
    st = one_size["studies"]["dense"]
    assert st.nd.status == "one-model-size" and st.env.status == "one-model-size"
    assert st.iso.status == "no-usable-budget" and st.noise.std == pytest.approx(SEED_STD, rel=1e-6)
    for d in ("b", "s"):
        assert (tmp_path / d / "isoflop.png").is_file() and (tmp_path / d / "loss_nd.png").is_file()


def test_figures_with_nothing_to_show_are_not_written_and_the_log_says_why(fake_sweep, tmp_path):
    said = []
    result = analyse([str(fake_sweep / "dense-*")], tmp_path, n_boot=20, holdout=None, log=said.append)
    assert not (tmp_path / "dense_vs_moe.png").exists() and not (tmp_path / "compute_multiplier.png").exists()
    assert "scaling: dense_vs_moe.png not written: no MoE run among the points" in said
    assert any(s.startswith("scaling: compute_multiplier.png not written: one family: no pair") for s in said)
    assert result["figures"] == ["loss_vs_flops.png", "loss_vs_tokens.png", "isoflop.png", "loss_nd.png"]
    assert all((tmp_path / f).stat().st_size > 10_000 for f in result["figures"])


def test_scaling_figures_have_no_overlapping_tick_labels(fake_sweep, tmp_path, tick_overlaps):
    analyse([str(fake_sweep)], tmp_path, n_boot=20, holdout=None, log=lambda _: None)
    names = {n for n, _ in tick_overlaps}  # compute_multiplier.png: one-size MoE here, so not written
    assert {"loss_vs_flops.png", "loss_vs_tokens.png", "dense_vs_moe.png", "isoflop.png", "loss_nd.png"} <= names
    assert [(n, o) for n, o in tick_overlaps if o] == []


def test_every_help_example_reads_its_runs_or_checks_its_design(capsys):
    """The examples in ``python -m analysis.scaling --help``: a runs folder the repository holds (read: finished
    runs), the quick sweep's folder (``tools.sweep --quick``'s out) or a design spec that the designer runs."""
    import shlex

    from omegaconf import OmegaConf

    from analysis.runs import expand_inputs
    from analysis.scaling import cli
    from analysis.scaling.design import cli as design_cli
    from analysis.scaling.design.cli import main as design_main
    from analysis.scaling.read import collect

    lines = [ln.split("#", 1)[0].strip() for ln in (cli.__doc__ + design_cli.__doc__).splitlines()]
    examples = [shlex.split(ln)[3:] for ln in lines if ln.startswith("python -m analysis.scaling ")]
    assert len(examples) >= 5
    quick_out = OmegaConf.load("tools/sweep/quick.yaml").out
    for argv in examples:
        if argv[0] == "design":
            argv = [*argv[1:argv.index("--sims")]] if "--sims" in argv else argv[1:]  # fewer simulations
            assert design_main([*argv, "--sims", "4"]) == 0, capsys.readouterr()
        elif argv[0] != quick_out:
            runs, problems = expand_inputs([argv[0]])
            assert not problems and collect(runs)[0], argv
    assert any(a[0] == quick_out for a in examples)
