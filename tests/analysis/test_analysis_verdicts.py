"""analysis.verdicts against known answers: t and TOST by hand, Holm's verdicts over a family, the interval
at the verdict's level (it excludes the null exactly when the verdict is better or worse), the CEG read per
seed through a known curve, the nats fallbacks, the margins on both scales, and the coverage of the
interval in simulated studies with a known CEG (slow)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from analysis import ceg_coverage, compute_curve, verdicts

E, A_C0, ALPHA, C0 = 3.0, 1.0, 0.3, 1e12  # L(C) = 3 + (C / 1e12)^-0.3
COMPUTES = [0.25e12, 0.5e12, 1e12, 2e12, 4e12]
C_ARM = 1e12


def loss(c: float) -> float:
    return E + A_C0 * (c / C0) ** -ALPHA


def ref_curves(seeds: int = 3, noise: float = 0.0, rng=None) -> dict:
    rng = rng if rng is not None else np.random.default_rng(0)
    return {s: [(c, loss(c) + noise * rng.standard_normal()) for c in COMPUTES] for s in range(seeds)}


def fit_of(curves: dict) -> dict:
    return compute_curve.fit_compute_curve([p for pts in curves.values() for p in pts])


def sf_t2(t: float) -> float:
    """P(T_2 >= t) in closed form: the t distribution with 2 df has CDF 1/2 + t / (2 sqrt(2 + t^2))."""
    return 0.5 - t / (2 * math.sqrt(2 + t * t))


def comparison(arm: dict, other: dict, c_arm: float = C_ARM, c_other: float = C_ARM, name: str = "arm") -> dict:
    return {"arm": name, "against": "ref", "arm_losses": arm, "other_losses": other,
            "arm_compute": {s: c_arm for s in arm}, "other_compute": {s: c_other for s in other}}


# --------------------------------------------------------------------------------------------
# t and TOST
# --------------------------------------------------------------------------------------------


def test_paired_inference_by_hand():
    res = verdicts.paired_inference([0.01, 0.02, 0.03], (-0.1, 0.1))
    se = 0.01 / math.sqrt(3)
    assert res["mean"] == pytest.approx(0.02) and res["sd"] == pytest.approx(0.01)
    assert res["se"] == pytest.approx(se) and res["n"] == 3 and res["df"] == 2
    assert res["p_difference"] == pytest.approx(2 * sf_t2(2 * math.sqrt(3)))  # 0.0742
    assert res["p_tost"] == pytest.approx(sf_t2((0.1 - 0.02) / se))  # the upper test is the weaker one
    lo, hi = verdicts.interval(res, 0.05)
    half = stats.t.ppf(0.975, 2) * se
    assert (lo, hi) == pytest.approx((0.02 - half, 0.02 + half))


def test_tost_rejects_exactly_when_the_90_percent_interval_is_inside_the_margin():
    diffs = [0.01, 0.02, 0.03]  # 90% interval [0.00314, 0.03686]
    assert verdicts.paired_inference(diffs, (-0.1, 0.0369))["p_tost"] < 0.05
    assert verdicts.paired_inference(diffs, (-0.1, 0.0368))["p_tost"] > 0.05
    lo, hi = verdicts.interval(verdicts.paired_inference(diffs, (-0.1, 0.1)), 0.05, two_sided=False)
    assert (lo, hi) == pytest.approx((0.00314, 0.03686), abs=1e-5)


def test_paired_inference_small_and_constant_samples():
    one = verdicts.paired_inference([0.5], (-0.1, 0.1))
    assert one["mean"] == 0.5 and one["p_difference"] is None and one["p_tost"] is None and one["sd"] is None
    assert verdicts.paired_inference([], (-0.1, 0.1))["mean"] is None
    const = verdicts.paired_inference([0.05, 0.05, 0.05], (-0.1, 0.1))
    assert const["p_difference"] == 0.0 and const["p_tost"] == 0.0
    zero = verdicts.paired_inference([0.0, 0.0], (-0.1, 0.1))
    assert zero["p_difference"] == 1.0 and zero["p_tost"] == 0.0
    with pytest.raises(ValueError, match="low < high"):
        verdicts.paired_inference([0.0, 0.1], (0.1, -0.1))


def test_curve_variance_widens_the_interval_with_satterthwaite_df():
    """se^2 = s^2 / n + var_curve, with Welch-Satterthwaite df (between n - 1 and n + m - 2)."""
    x = [0.10, 0.12, 0.08]
    plain = verdicts.paired_inference(x, (-0.1, 0.1))
    both = verdicts.paired_inference(x, (-0.1, 0.1), curve_var=plain["se"] ** 2, n_curves=3)
    assert both["se"] == pytest.approx(math.sqrt(2) * plain["se"])
    a = plain["se"] ** 2
    assert both["df"] == pytest.approx((2 * a) ** 2 / (a * a / 2 + a * a / 2)) == pytest.approx(4.0)
    # two variance parts of equal size, each on 2 df, pool to 4 df: the t quantile falls from 4.30 to 2.78
    assert verdicts.interval(both, 0.05)[1] == pytest.approx(0.10 + stats.t.ppf(0.975, 4) * both["se"])
    assert both["p_difference"] == pytest.approx(2 * stats.t.sf(0.10 / both["se"], 4))


# --------------------------------------------------------------------------------------------
# verdicts over a family
# --------------------------------------------------------------------------------------------


def nats_results(family: dict, margin=(-0.1, 0.1)) -> list[dict]:
    return [{**verdicts.paired_inference(d, margin), "scale": verdicts.NATS} for d in family.values()]


def test_one_verdict_of_each_class():
    family = {
        "better": [-0.50, -0.52, -0.48, -0.51],
        "worse": [0.50, 0.52, 0.48, 0.51],
        "equivalent within the margin": [0.001, -0.001, 0.002, -0.002, 0.0],
        "worse (within the margin)": [0.05, 0.051, 0.049, 0.0505],
        "better (within the margin)": [-0.05, -0.051, -0.049, -0.0505],
        "unresolved": [0.05, -0.08, 0.09],
    }
    out = verdicts.decide(nats_results(family))
    assert [r["class"] for r in out] == list(family)
    assert out[-1]["seeds_needed"] is not None and out[0].get("seeds_needed") is None


def test_holm_over_the_family_and_the_interval_at_its_level():
    """p 0.03 alone is 'worse' with a 95% interval above 0; beside p 0.04 neither survives Holm (0.03 > 0.05/2),
    and each interval, read at 1 - 0.05 p / p_Holm, then holds 0: never an interval excluding the null beside
    'unresolved'."""
    def diffs(p):  # mean 1 and sd s over 3 seeds with the two-sided p exactly p
        s = math.sqrt(3) / stats.t.isf(p / 2, 2)
        return [1 - s, 1.0, 1 + s]

    alone = verdicts.decide(nats_results({"a": diffs(0.03)}))[0]
    assert alone["class"] == "worse" and alone["alpha_interval"] == pytest.approx(0.05) and alone["low"] > 0
    a, b = verdicts.decide(nats_results({"a": diffs(0.03), "b": diffs(0.04)}))
    assert a["p_difference_holm"] == pytest.approx(0.06) and b["p_difference_holm"] == pytest.approx(0.06)
    assert a["class"] == b["class"] == "unresolved"
    assert a["alpha_interval"] == pytest.approx(0.05 * 0.03 / 0.06) and a["low"] < 0 < a["high"]
    assert b["alpha_interval"] == pytest.approx(0.05 * 0.04 / 0.06) and b["low"] < 0 < b["high"]


def test_the_interval_excludes_the_null_exactly_when_holm_rejects():
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(1, 6))
        family = {i: list(rng.normal(rng.normal(0, 0.03), 0.03, int(rng.integers(2, 6)))) for i in range(k)}
        for r in verdicts.decide(nats_results(family, (-0.02, 0.02))):
            excludes = not (r["low"] <= 0 <= r["high"])
            decided = r["class"].startswith(("better", "worse"))
            assert excludes == decided or abs(r["p_difference_holm"] - 0.05) < 1e-9, r
            inside = -0.02 < r["equivalence_low"] and r["equivalence_high"] < 0.02
            assert inside == ("within the margin" in r["class"] or r["class"].startswith("equivalent"))


# --------------------------------------------------------------------------------------------
# the CEG through the curve
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0.7, 1.0, 1.6])
def test_ceg_through_a_known_curve_is_exact_without_noise(k):
    curves = ref_curves()
    ref = {s: loss(C_ARM) for s in range(3)}
    arm = {s: loss(k * C_ARM) for s in range(3)}
    margin = verdicts.margins(fit_of(curves), C_ARM, {"ceg": [0.9, 1.1]})
    (r,) = verdicts.family(fit_of(curves), curves, [comparison(arm, ref)], margin)
    assert r["scale"] == verdicts.LN_CEG and r["ceg"] == pytest.approx(k, rel=1e-6)
    assert r["ceg_low"] == pytest.approx(k, rel=1e-6) and r["ceg_high"] == pytest.approx(k, rel=1e-6)


def test_shared_seed_luck_cancels_in_the_paired_ceg():
    """Each seed's luck is shared by the two arms (same seed, same data order): the per-seed ln CEGs agree
    to within the arms' own noise, so the interval is narrow and holds the true 1.5."""
    rng = np.random.default_rng(7)
    luck = 0.02 * rng.standard_normal(4)
    own = 0.001 * rng.standard_normal((2, 4))
    ref = {s: loss(C_ARM) + luck[s] + own[0, s] for s in range(4)}
    arm = {s: loss(1.5 * C_ARM) + luck[s] + own[1, s] for s in range(4)}
    curves = ref_curves(4, noise=0.002, rng=np.random.default_rng(8))
    fit = fit_of(curves)
    (r,) = verdicts.family(fit, curves, [comparison(arm, ref)], verdicts.margins(fit, C_ARM, {"ceg": [0.9, 1.1]}))
    assert r["ceg_low"] < 1.5 < r["ceg_high"] and r["ceg_high"] / r["ceg_low"] < 1.15
    assert r["class"] == "better" and r["se_curve"] > 0


def test_a_loss_outside_the_curve_falls_back_to_nats():
    curves = ref_curves()
    fit = fit_of(curves)
    ref = {s: loss(C_ARM) for s in range(3)}
    arm = {s: loss(8 * C_ARM) + 0.001 * s for s in range(3)}  # below L(c_max = 4e12): not extrapolated
    (r,) = verdicts.family(fit, curves, [comparison(arm, ref)], verdicts.margins(fit, C_ARM, {"ceg": [0.9, 1.1]}))
    assert r["scale"] == verdicts.NATS and "outside the curve's measured range" in r["why_nats"]
    assert r["why_nats"].startswith(f"`arm`'s seed 0 ({arm[0]:.3f})")  # the run that left the range, by name
    assert f"[{fit['l_min']:.3f}, {fit['l_max']:.3f}]" in r["why_nats"]
    assert r["mean"] == pytest.approx(loss(8 * C_ARM) + 0.001 - loss(C_ARM)) and r["class"] == "better"
    assert r["ceg"] is None and verdicts.fmt_interval(r).endswith("%") and "nats" in verdicts.fmt_interval(r)


def test_arms_of_different_compute_get_a_nats_verdict_and_a_ceg_per_flop():
    """An arm at 2x the compute reaching the reference's loss at 2x: the same loss per FLOP (CEG 1), 0.13 nats
    better at the matched resource; the verdict is on the losses, the CEG kept beside it."""
    curves = ref_curves()
    fit = fit_of(curves)
    ref = {s: loss(C_ARM) + 0.001 * s for s in range(3)}
    arm = {s: loss(2 * C_ARM) + 0.001 * s + 0.0005 * (s == 1) for s in range(3)}
    (r,) = verdicts.family(fit, curves, [comparison(arm, ref, c_arm=2 * C_ARM)],
                           verdicts.margins(fit, C_ARM, {"ceg": [0.9, 1.1]}))
    assert r["scale"] == verdicts.NATS and "compute differs (2.00x)" in r["why_nats"]
    assert r["mean"] == pytest.approx(loss(2 * C_ARM) - loss(C_ARM), abs=1e-3) and r["class"] == "better"
    assert r["ceg_point"] == pytest.approx(1.0, abs=0.01)


def test_margins_on_both_scales_agree_on_the_curve():
    fit = fit_of(ref_curves())
    m = verdicts.margins(fit, C_ARM, {"ceg": [0.9, 1.1]})
    assert m[verdicts.LN_CEG] == pytest.approx((math.log(0.9), math.log(1.1)))
    assert m[verdicts.NATS] == pytest.approx((loss(1.1 * C_ARM) - loss(C_ARM), loss(0.9 * C_ARM) - loss(C_ARM)),
                                             rel=1e-6)
    n = verdicts.margins(fit, C_ARM, {"nats": 0.02})
    assert n[verdicts.NATS] == (-0.02, 0.02)
    lo, hi = n[verdicts.LN_CEG]
    assert loss(math.exp(lo) * C_ARM) == pytest.approx(loss(C_ARM) + 0.02, rel=1e-6)
    assert loss(math.exp(hi) * C_ARM) == pytest.approx(loss(C_ARM) - 0.02, rel=1e-6)
    assert verdicts.margins(None, None, {"ceg": [0.9, 1.1]})[verdicts.LN_CEG] is None


def test_calibration_of_the_reference_on_its_own_curve():
    curves = ref_curves()
    fit = fit_of(curves)
    cal = verdicts.calibration(fit, {s: loss(C_ARM) * (1 + 1e-4 * (s - 1)) for s in range(3)},
                               {s: C_ARM for s in range(3)})
    assert cal["n"] == 3 and cal["ceg"] == pytest.approx(1.0, abs=2e-3) and cal["low"] < 1.0 < cal["high"]


# --------------------------------------------------------------------------------------------
# coverage by simulation
# --------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("n_seeds", [3, 5])
@pytest.mark.parametrize("regime", ["independent", "shared"])
def test_the_95_percent_interval_covers_a_known_ceg(n_seeds, regime):
    """1500 simulated studies per cell under the optimizers report's law (``analysis.ceg_coverage``): the
    binomial sd of a 95% coverage over 1500 studies is 0.0056, so [0.93, 0.97] is +-3.5 sd."""
    r = ceg_coverage.coverage(ceg_coverage.LAWS["optimizers"], n_seeds, regime, 1500, seed=11)
    assert 0.93 <= r["coverage"] <= 0.97, r
