"""analysis.sequential: the spending functions, the design read from a spec, the look-by-look replay of a
family, and (slow) its error rates by simulation with known answers."""

from __future__ import annotations

import math

import pytest

from analysis import ceg_coverage, sequential, verdicts
from archlab.errors import RecipeError

MARGIN = {verdicts.LN_CEG: None, verdicts.NATS: (-0.02, 0.02), "from": "+-0.02 nats"}


@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_levels_sum_to_alpha_and_spending_grows(kind):
    d = sequential.Design(3, 9, 2, kind)
    assert d.stages == [3, 5, 7, 9]
    levels = d.levels()
    assert math.isclose(sum(levels), 0.05, rel_tol=1e-12) and all(a > 0 for a in levels)
    cum = [sequential.spent(n / 9, 0.05, kind) for n in d.stages]
    assert cum == sorted(cum) and math.isclose(cum[-1], 0.05)


def test_obrien_fleming_spends_less_early_than_pocock():
    pocock, obf = sequential.Design(3, 9, 2).levels(), sequential.Design(3, 9, 2, "obrien-fleming").levels()
    assert obf[0] < pocock[0] / 10 and obf[-1] > pocock[-1]


def test_stages_end_at_max_even_off_the_step():
    assert sequential.Design(3, 8, 2).stages == [3, 5, 7, 8]


@pytest.mark.parametrize("value, message", [
    ({"min": 3}, "seeds.max=None"),
    ({"min": 1, "max": 5}, "seeds.min=1: at least 2"),
    ({"min": 3, "max": 3}, "must exceed min=3"),
    ({"min": 3, "max": 9, "spending": "bonferroni"}, "seeds.spending='bonferroni'"),
    ({"min": 3, "max": 9, "steps": 2}, "unknown keys ['steps']"),
])
def test_bad_designs_are_refused_by_key(value, message):
    with pytest.raises(RecipeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sequential.check(value)


def test_a_list_of_seeds_is_no_design():
    assert sequential.check([0, 1, 2]) is None


def _comparison(arm: str, diffs: list[float], base: float = 3.0) -> dict:
    other = {s: base + 0.01 * ((s * 7) % 5) for s in range(len(diffs))}
    losses = {s: other[s] + d for s, d in enumerate(diffs)}
    comp = {s: 1e12 for s in range(len(diffs))}
    return {"arm": arm, "against": "ref", "arm_losses": losses, "other_losses": other, "arm_compute": comp,
            "other_compute": comp}


def test_a_clear_difference_stops_at_the_first_look_an_unclear_one_runs_to_the_cap():
    d = sequential.Design(3, 7, 2)
    clear = _comparison("clear", [0.30, 0.31, 0.29, 0.30, 0.31, 0.30, 0.29])
    noisy = _comparison("noisy", [0.05, -0.06, 0.04, -0.05, 0.06, -0.04, 0.05])
    res = {r["arm"]: r for r in sequential.family(d, None, {}, [clear, noisy], MARGIN)}
    assert res["clear"]["class"] == "worse" and res["clear"]["look"] == 1 and res["clear"]["seeds"] == [0, 1, 2]
    assert res["clear"]["stopped"] == "resolved at look 1 (3 seeds)"
    assert math.isclose(res["clear"]["alpha_look"], d.levels()[0])
    assert res["noisy"]["class"] == "unresolved" and res["noisy"]["look"] == 3 and len(res["noisy"]["seeds"]) == 7
    assert res["noisy"]["stopped"] == "cap: 7 seeds, unresolved"


def test_the_look_reads_holm_over_the_open_comparisons_at_its_level():
    d = sequential.Design(3, 5, 2)
    c = [_comparison("a", [0.30, 0.31, 0.29, 0.30, 0.31]), _comparison("b", [0.05, -0.06, 0.04, -0.05, 0.06])]
    first = verdicts.family(None, {}, [sequential._restricted(x, [0, 1, 2]) for x in c], MARGIN,
                            alpha=d.levels()[0])
    res = sequential.family(d, None, {}, c, MARGIN)
    assert res[0]["p_difference_holm"] == first[0]["p_difference_holm"]
    second = verdicts.family(None, {}, [c[1]], MARGIN, alpha=d.levels()[1])  # only b is still open
    assert res[1]["p_difference_holm"] == second[0]["p_difference_holm"] and res[1]["look"] == 2


def test_next_seeds_go_to_both_arms_of_each_open_comparison_only():
    d = sequential.Design(3, 7, 2)
    clear = _comparison("clear", [0.30, 0.31, 0.29])
    noisy = _comparison("noisy", [0.05, -0.06, 0.04])
    noisy["against"] = "other"
    res = sequential.family(d, None, {}, [clear, noisy], MARGIN)
    assert res[1]["stopped"].startswith("not continued past look 1")
    assert sequential.next_seeds(d, res) == {"noisy": [3, 4], "other": [3, 4]}


def test_a_comparison_whose_arms_stopped_is_not_read_at_later_looks():
    d = sequential.Design(3, 5, 2)
    clear = _comparison("clear", [0.30, 0.31, 0.29])  # only 3 seeds: it stopped at look 1
    res = sequential.family(d, None, {}, [clear], MARGIN)
    assert res[0]["look"] == 1 and sequential.next_seeds(d, res) == {}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sequential.SPENDING)
def test_error_rates_stay_at_alpha_over_the_looks(kind):
    """Known answers: no difference (CEG 1: 'better' or 'worse' is an error) and a CEG at the margin's edge
    (1.1: 'equivalent' is an error), 600 simulated studies each; the rate may exceed 5% only by sampling error
    (3 standard errors of a 5% rate)."""
    d = sequential.Design(3, 9, 2, kind)
    law = ceg_coverage.LAWS["optimizers"]
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / 600)
    null = sequential.simulate(d, law, 1.0, 600, seed=1)
    assert null["better"] + null["worse"] <= bound
    edge = sequential.simulate(d, law, 1.1, 600, seed=2)
    assert edge["equivalent"] <= bound
    gain = sequential.simulate(d, law, 1.25, 200, seed=3)
    assert gain["better"] > 0.8 and gain["mean_seeds"] < 9  # a real gain is found, and before the cap


def test_a_seed_that_failed_leaves_the_comparison_in_the_family_on_the_seeds_that_finished():
    c = _comparison("clear", [0.30, 0.30, 0.30, 0.30])
    del c["arm_losses"][0]  # seed 0 diverged
    res = sequential.family(sequential.Design(3, 5, 2), None, {}, [c], MARGIN)
    assert len(res) == 1 and res[0]["seeds"] == [1, 2] and res[0]["look"] == 1


# --------------------------------------------------------------------------------------------
# the simulators' stress cases: heavy-tailed seed noise, a curve the fitter does not assume
# --------------------------------------------------------------------------------------------


def test_t3_noise_has_unit_variance_and_heavier_tails_than_normal():
    import numpy as np

    z = ceg_coverage.draw(np.random.default_rng(0), "t3", 200_000)
    assert np.std(z) == pytest.approx(1.0, rel=0.1)  # t3's variance converges slowly: a loose band
    assert np.mean(np.abs(z) > 4) > 10 * 6.3e-5  # a normal puts 6.3e-5 beyond 4 sd
    with pytest.raises(ValueError, match="one of normal, t3"):
        ceg_coverage.draw(np.random.default_rng(0), "laplace")


def test_the_misspecified_truth_bends_away_from_the_power_law_off_c0():
    law = ceg_coverage.LAWS["attention-kv"]
    bent = ceg_coverage.truth(law, "misspecified")
    assert bent.kappa == ceg_coverage.KAPPA and ceg_coverage.truth(law, "power-law") is law
    assert float(bent.loss(law.c0)) == pytest.approx(float(law.loss(law.c0)))  # u = 0: the same point
    for f in (0.25, 2.0):  # curvature raises the loss on both sides of c0
        assert float(bent.loss(f * ceg_coverage.BUDGET)) > float(law.loss(f * ceg_coverage.BUDGET)) + 0.01
    with pytest.raises(ValueError, match="one of power-law, misspecified"):
        ceg_coverage.truth(law, "broken")


def test_the_simulators_take_the_stress_cases(capsys):
    """One study per cell through each command line: the options reach the simulation and the table prints."""
    import numpy as np

    curves, ref, arm = ceg_coverage.simulate(np.random.default_rng(0), ceg_coverage.LAWS["balancing"], 3, "shared",
                                             1.25, noise="t3")
    assert len(curves) == 3 and len(curves[0]) == len(ceg_coverage.FRACTIONS) and set(arm) == {0, 1, 2}
    sequential.main(["--sims", "1", "--noise", "t3", "--truth", "misspecified", "--g", "1.0"])
    out = capsys.readouterr().out
    assert "noise t3" in out and "curved" in out and "seeds 3 to 5" in out and out.count("| pocock | 1 |") == 2
    ceg_coverage.main(["--sims", "1", "--laws", "attention-kv", "--seeds", "3", "--noise", "t3", "--truth",
                       "misspecified"])
    assert "| attention-kv | misspecified | t3 | paired | 3 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        sequential.main(["--sims", "0"])
