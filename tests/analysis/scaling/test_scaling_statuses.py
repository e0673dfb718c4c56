"""analysis.scaling: honest statuses. A fit whose interval reaches an optimiser bound, an IsoFLOP minimum that
the trained sizes do not bracket and an N_opt outside the trained sizes are each flagged by name, in the tables
and in fits.json, never "ok"; points where none occurs stay "ok"; the numbers are the same with or without a flag
(checked against the committed docs/scaling/non-embedding/fits.json, written before the flags existed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import analysis.scaling.plots as plots
from analysis.scaling.fits.common import OK, bound_flags, bound_thresholds, reported_status
from analysis.scaling.fits.envelope import EnvelopeExponent
from analysis.scaling.fits.isoflop import fit_isoflop_profile, isoflop_profiles
from analysis.scaling.fits.log_log import fit_log_log
from analysis.scaling.fits.loss_nd import NDFit, compute_optimal, fit_loss_nd
from analysis.scaling.fits.noise import NoiseFloor
from analysis.scaling.fits.power_law import fit_power_law
from analysis.scaling.study import FamilyStudy, n_sensitivity
from analysis.scaling.tables import (
    exponent_table,
    fits_table,
    isoflop_table,
    n_sensitivity_table,
    nd_table,
    optimum_table,
)

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "scaling" / "non-embedding" / "fits.json"  # before flags
C_NARROW = np.logspace(12, 13, 8)


def _rows(table: str, first: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith(f"| {first} |")]


# ------------------------------------------------------------------ intervals at an optimiser bound


def test_bound_flags_name_the_side_and_tell_interval_from_estimate():
    lo, hi = bound_thresholds(0.0, 5.0)
    assert (lo, hi) == pytest.approx((0.005, 4.995))
    at_5 = bound_flags([(3.705, [0.034, 5.0], lo, hi, "alpha >= 0", "alpha <= 5")])
    assert at_5 == ["interval at bound (alpha <= 5)"]
    assert bound_flags([(0.3, [0.0, 0.5], lo, hi, "alpha >= 0", "alpha <= 5")]) == ["interval at bound (alpha >= 0)"]
    assert bound_flags([(5.0, None, lo, hi, "alpha >= 0", "alpha <= 5")]) == ["estimate at bound (alpha <= 5)"]
    assert bound_flags([(0.3, [0.2, 0.4], lo, hi, "alpha >= 0", "alpha <= 5")]) == []
    # E's floor: under it E no longer changes the fit, at its bound (E = 0) in effect
    floor_lo, _ = bound_thresholds(math.log(1e-6), math.log(4.0), floor=math.log(3e-3))
    assert floor_lo == pytest.approx(math.log(3e-3))


def test_lc_alpha_at_its_bound_is_flagged_by_name_not_ok():
    L = 2.0 + (C_NARROW / 1e12) ** -8.0  # steeper than alpha's bound of 5: the fit stops at it
    f = fit_power_law(C_NARROW, L, n_boot=20)
    assert f.status == OK and f.alpha == pytest.approx(5.0, abs=1e-6)  # fitted, and used as before
    assert f.ci["alpha"][1] == pytest.approx(5.0, abs=1e-6)
    assert f.flags == ["interval at bound (alpha <= 5)"]
    assert reported_status(f) == "interval at bound (alpha <= 5)"
    assert json.loads(json.dumps(f.to_json()))["status"] == "interval at bound (alpha <= 5)"
    (row,) = _rows(fits_table({"steep": f}), "steep")
    assert row.endswith(f"| interval at bound (alpha <= 5) ({f.n_boot} bootstrap fits over points) |")
    assert "| ok" not in row


def test_lc_pure_power_law_puts_e_at_its_floor():
    f = fit_power_law(C_NARROW, 30.0 * (C_NARROW / 1e12) ** -0.25, n_boot=20)  # E = 0: below the bound 1e-6
    assert f.status == OK and f.E < 1e-5
    assert f.flags == ["interval at bound (E >= 1e-06)"]
    assert f.to_json()["status"] == "interval at bound (E >= 1e-06)"


def test_lc_interior_fit_stays_ok():
    C = np.logspace(12, 16, 8)
    L = (2.0 + 30.0 * (C / 1e12) ** -0.25) * np.exp(np.random.default_rng(0).normal(0, 0.003, len(C)))
    f = fit_power_law(C, L, n_boot=20)
    assert f.flags == [] and reported_status(f) == OK and f.to_json()["status"] == OK
    (row,) = _rows(fits_table({"law": f}), "law")
    assert row.endswith(f"| ok ({f.n_boot} bootstrap fits over points) |")


def _nd_grid(sizes):
    N, D = np.meshgrid(sizes, np.geomspace(1e6, 1e10, 5))
    return N.ravel(), D.ravel()


def test_nd_alpha_at_its_bound_is_flagged_with_and_without_an_interval():
    N, D = _nd_grid(np.geomspace(2, 20, 5))
    L = 1.7 + 400.0 * N ** -7.0 + 410.0 * D ** -0.28  # alpha 7 > the bound 5
    f = fit_loss_nd(N, D, L, n_boot=0)
    assert f.status == OK and f.alpha == pytest.approx(5.0) and f.flags == ["estimate at bound (alpha <= 5)"]
    f = fit_loss_nd(N, D, L, n_boot=12)
    assert f.flags == ["interval at bound (alpha <= 5)"] and f.to_json()["status"] == f.flags[0]
    (row,) = _rows(nd_table({"steep": _study(f)}), "steep")
    assert "| interval at bound (alpha <= 5) (" in row and "| ok" not in row


def test_nd_without_an_irreducible_loss_puts_e_at_its_floor():
    N, D = _nd_grid(np.geomspace(1e5, 1e8, 5))
    f = fit_loss_nd(N, D, 400.0 * N ** -0.34 + 410.0 * D ** -0.28, n_boot=0)
    assert f.status == OK and f.flags == ["estimate at bound (E >= 9.36e-14)"]


def test_nd_interior_fit_stays_ok():
    N, D = _nd_grid(np.geomspace(1e5, 1e8, 5))
    f = fit_loss_nd(N, D, 1.7 + 400.0 * N ** -0.34 + 410.0 * D ** -0.28, n_boot=0)
    assert f.status == OK and f.flags == [] and f.to_json()["status"] == OK


# ------------------------------------------------------------------ IsoFLOP minima not bracketed

SIZES = np.geomspace(1e5, 1e7, 5)
X = np.log(SIZES)


def _parabola(vertex_x):
    return 3.0 + 0.05 * (X - vertex_x) ** 2


def test_profile_whose_lowest_loss_is_the_smallest_size_is_not_bracketed():
    vertex = X[0] + 0.3 * (X[1] - X[0])  # within the sizes, but the loss rises with N over every size trained
    assert np.all(np.diff(_parabola(vertex)) > 0)
    p = fit_isoflop_profile(SIZES, _parabola(vertex), budget=1e18, n_boot=50)
    assert p.status == OK and p.bracketed and p.N_opt == pytest.approx(math.exp(vertex), rel=1e-9)  # as before
    assert p.flags == ["minimum not bracketed (lowest loss at the smallest trained size, N = 1e+05)"]
    assert p.to_json()["status"] == p.flags[0]
    falling = fit_isoflop_profile(SIZES, _parabola(X[-1] - 0.3 * (X[-1] - X[-2])), budget=1e18, n_boot=0)
    assert falling.flags == ["minimum not bracketed (lowest loss at the largest trained size, N = 1e+07)"]


def test_profile_whose_vertex_lies_outside_the_sizes_names_both_defects():
    p = fit_isoflop_profile(SIZES, _parabola(X[0] - 1.0), budget=1e18, n_boot=0)
    assert p.status == "minimum-outside-sampled-range" and not p.bracketed
    assert p.flags == ["minimum not bracketed (the parabola's vertex outside the trained sizes)",
                       f"N_opt outside the trained sizes (N_opt = {p.N_opt:.3g} < smallest trained N = 1e+05)"]
    assert p.to_json()["status"] == "minimum-outside-sampled-range" and p.to_json()["flags"] == p.flags


def test_bracketed_profile_stays_ok():
    p = fit_isoflop_profile(SIZES, _parabola(X[2]), budget=1e18, n_boot=50)
    assert p.status == OK and p.flags == [] and p.to_json()["status"] == OK


def _isoflop_sweep(vertex_offsets):
    """5 sizes per budget around a true optimum N* = 1e6 (C / 1e18)^0.5, the vertex moved by the offsets (in ln N)."""
    N, C, L = [], [], []
    budgets = np.geomspace(1e18, 1e20, len(vertex_offsets))
    for c, off in zip(budgets, vertex_offsets):
        centre = math.log(1e6 * (c / 1e18) ** 0.5)
        sizes = np.exp(centre + np.linspace(-1.5, 1.5, 5))
        N += list(sizes)
        C += [c] * 5
        L += list(3.0 + 0.05 * (np.log(sizes) - centre - off) ** 2)
    return np.array(N), np.array(C), np.array(L), budgets


def test_n_star_of_c_through_an_unbracketed_minimum_is_flagged_with_the_same_numbers():
    N, C, L, budgets = _isoflop_sweep([0.0, -1.3, 0.0, 0.0])  # the 2nd budget: lowest loss at its smallest size
    res = isoflop_profiles(N, C, L, n_boot=30)
    assert [p.status for p in res.profiles] == [OK] * 4
    assert [bool(p.flags) for p in res.profiles] == [False, True, False, False]
    assert res.status == OK
    assert res.flags == [f"minimum not bracketed at 1 of the 4 budgets of N*(C) (C = {budgets[1]:.3g})"]
    assert res.to_json()["status"] == res.flags[0]
    # still used in N*(C), as before: the slope is the line through all four minima
    line = fit_log_log(budgets, [p.N_opt for p in res.profiles], n_boot=0)
    assert res.power_law.slope == pytest.approx(line.slope, rel=1e-12)
    clean = isoflop_profiles(*_isoflop_sweep([0.0] * 4)[:3], n_boot=30)
    assert clean.status == OK and clean.flags == [] and clean.to_json()["status"] == OK
    assert clean.power_law.slope == pytest.approx(0.5, rel=1e-6)


# ------------------------------------------------------------------ N_opt outside the trained sizes


def _nd_law():
    N, D = _nd_grid(np.geomspace(1e5, 1e8, 5))
    return fit_loss_nd(N, D, 1.7 + 400.0 * N ** -0.34 + 410.0 * D ** -0.28, n_boot=0)


def test_compute_optimal_outside_the_trained_sizes_is_flagged():
    f = _nd_law()
    assert f.N_range == [1e5, 1e8] and f.flags == []
    inside = 6 * (1e6 / compute_optimal(f, 6.0, 6.0).G) ** (1 / f.a_opt)  # the C whose N_opt is 1e6
    ok = compute_optimal(f, inside, 6.0)
    assert ok.N_opt == pytest.approx(1e6, rel=1e-6) and ok.flags == [] and ok.to_json()["status"] == OK
    big = compute_optimal(f, inside * 1e12, 6.0)
    assert big.status == OK and big.N_opt > 1e8
    assert big.flags == [f"N_opt outside the trained sizes (N_opt = {big.N_opt:.3g} > largest trained N = 1e+08)"]
    assert big.to_json()["status"] == big.flags[0]
    small = compute_optimal(f, inside * 1e-8, 6.0)
    assert small.flags[0].startswith("N_opt outside the trained sizes (N_opt = ") and "< smallest trained N = 1e+05" \
        in small.flags[0]


def test_compute_optimal_carries_the_flags_of_its_fit():
    N, D = _nd_grid(np.geomspace(1e5, 1e8, 5))
    f = fit_loss_nd(N, D, 400.0 * N ** -0.34 + 410.0 * D ** -0.28, n_boot=0)  # E at its floor
    opt = compute_optimal(f, 6 * 1e6 * 1e8, 6.0)
    assert "L(N, D): estimate at bound (E >= 9.36e-14)" in opt.flags and reported_status(opt) != OK


# ------------------------------------------------------------------ the tables and the study's fits.json


def _study(nd, iso=None, C_ref=None) -> FamilyStudy:
    iso = iso if iso is not None else isoflop_profiles([1.0], [1.0], [1.0], n_boot=0)
    C_ref = C_ref or 6 * 1e6 * 1e8
    opt = compute_optimal(nd, C_ref, 6.0)
    return FamilyStudy(family="f", n_kind="non_embedding", runs=[], N=list(nd.N_range or [1.0]), D=[], C=[], L=[],
                       L_err=[], n_seeds=[], k=6.0, k_range=[6.0, 6.0], C_ref=C_ref, nd=nd, optimum=opt,
                       optimum_6nd=opt, iso=iso, env=EnvelopeExponent(status="one-model-size"),
                       noise=NoiseFloor(status="no-seed-groups"))


def test_every_table_and_fits_json_name_the_flags():
    f = _nd_law()
    N, C, L, budgets = _isoflop_sweep([0.0, -1.3, 0.0, 0.0])
    st = _study(f, isoflop_profiles(N, C, L, n_boot=30), C_ref=1e40)  # N_opt far beyond 1e8
    studies = {"f": st}
    opt_rows = _rows(optimum_table(studies), "f")
    assert len(opt_rows) == 2 and all("| N_opt outside the trained sizes (N_opt = " in r for r in opt_rows)
    iso_rows = _rows(isoflop_table(studies), "f")
    assert ["minimum not bracketed (lowest loss at the smallest trained size" in r for r in iso_rows] == \
        [False, True, False, False]
    assert sum(r.endswith("| ok |") for r in iso_rows) == 3
    (ex,) = _rows(exponent_table(studies), "f")
    assert "; minimum not bracketed at 1 of the 4 budgets of N*(C)" in ex
    (sens,) = _rows(n_sensitivity_table({"f": {"non_embedding": st}}, "non_embedding"), "f")
    assert sens.endswith(f"| ok; approach 2: minimum not bracketed at 1 of the 4 budgets of N*(C) "
                         f"(C = {budgets[1]:.3g}) |")
    assert n_sensitivity({"f": {"non_embedding": st}})["f"]["non_embedding"]["approach_2_flags"] == st.iso.flags
    saved = json.loads(json.dumps(st.to_json()))
    assert saved["compute_optimal"]["status"].startswith("N_opt outside the trained sizes")
    assert saved["isoflop"]["status"].startswith("minimum not bracketed at 1 of the 4")
    assert saved["isoflop"]["profiles"][1]["status"].startswith("minimum not bracketed (")
    assert saved["loss_nd"]["status"] == OK and saved["loss_nd"]["flags"] == []
    ex = st.exponents()
    assert ex["approach_2_isoflop"]["status"] == st.iso.flags[0] and ex["approach_3_loss_nd"]["status"] == OK


def test_the_isoflop_figure_draws_an_unbracketed_minimum_hollow_and_names_it(monkeypatch, tmp_path):
    figs = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figs.append(fig) or path)
    N, C, L, budgets = _isoflop_sweep([0.0, -1.3, 0.0, 0.0])
    plots.plot_isoflop({"f": _study(_nd_law(), isoflop_profiles(N, C, L, n_boot=30))}, "N", tmp_path / "iso.png")
    left, right = figs[0].axes[:2]
    labels = left.get_legend_handles_labels()[1]
    assert labels[1] == f"C = {budgets[1]:.3g} FLOPs (minimum not bracketed)" and "(" not in labels[0]
    assert "hollow ★: minimum not bracketed by the sizes" in left.get_title()
    assert "N*(C) fit: minimum not bracketed at 1 budget(s)" in right.get_title()
    stars = [line for line in left.get_lines() if line.get_marker() == "*"]
    assert [line.get_markerfacecolor() == "none" for line in stars] == [False, True, False, False]


# ------------------------------------------------------------------ the committed report: same numbers, new flags


@pytest.fixture(scope="module")
def committed():
    if not COMMITTED.exists():
        pytest.skip(f"{COMMITTED} not present")
    return json.loads(COMMITTED.read_text())


def _numbers(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in ("status", "flags")}


def test_committed_lc_fit_refits_to_the_same_numbers_and_gains_its_flag(committed):
    fam = committed["families"]["dense"]
    fit = committed["fit"]
    f = fit_power_law([p["flops"] for p in fam["points"]], [p["loss"] for p in fam["points"]],
                      n_boot=fit["bootstrap_resamples"], huber_delta=fit["huber_delta"], seed=fit["seed"])
    got = json.loads(json.dumps(f.to_json()))
    assert _numbers(got) == {k: v for k, v in fam.items() if k in got and k not in ("status", "flags")}
    assert fam["status"] == OK and got["status"] == "interval at bound (E >= 1e-06)"  # E = 0.000 [0.000, 1.407]


def test_committed_isoflop_profiles_refit_to_the_same_numbers_and_gain_their_flags(committed):
    flagged = {}
    for fam, st in committed["scaling_nd"].items():
        for j, p in enumerate(st["isoflop"]["profiles"]):
            got = fit_isoflop_profile(p["N"], p["L"], budget=p["budget"], C=p["C"], L_err=p["L_err"],
                                      n_boot=committed["fit"]["bootstrap_resamples"],
                                      seed=committed["fit"]["seed"] + j).to_json()
            got = json.loads(json.dumps(got))
            assert _numbers(got) == _numbers(p), (fam, p["budget"])
            if got["flags"]:
                flagged[(fam, p["budget"])] = got["status"]
    assert {k: v.split(" (")[0] for k, v in flagged.items()} == {
        (fam, 1e11): "minimum not bracketed" for fam in ("deepseek", "dense", "mixtral")}


def test_committed_compute_optima_are_the_same_and_flag_those_beyond_the_sizes(committed):
    outside = set()
    for fam, st in committed["scaling_nd"].items():
        nd = st["loss_nd"]
        fit = NDFit(n_points=nd["n_points"], status=OK, N_range=nd["N_range"],
                    **{k: nd[k] for k in ("E", "A", "alpha", "B", "beta")})
        for key in ("compute_optimal", "compute_optimal_6nd"):
            want = st[key]
            got = compute_optimal(fit, want["C"], want["k"])
            for name in ("a", "b", "G", "N_opt", "D_opt", "tokens_per_param", "L_opt"):
                assert getattr(got, name) == pytest.approx(want[name], rel=1e-12), (fam, key, name)
            if got.flags:
                outside.add((fam, key))
                assert got.flags[0].startswith("N_opt outside the trained sizes (N_opt = ")
    assert outside == {("deepseek", "compute_optimal_6nd"), ("dense", "compute_optimal_6nd")}
