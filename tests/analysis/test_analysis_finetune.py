"""analysis.measurements.finetune on fake scores: the per-budget intervals over seeds, the paired verdict on the
test loss (one inference per comparison, Holm over every budget's comparisons) and the accuracy difference."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from analysis.experiment_spec import ArmSpec, Budget, Finetune, Spec, Tune
from analysis.measurements.finetune import summarise

B1, B2 = Budget("tokens", 1.0e6), Budget("tokens", 2.0e6)
LOSS = {("gpt", 1): [0.60, 0.62, 0.58], ("bert", 1): [0.50, 0.53, 0.49],
        ("gpt", 2): [0.55, 0.56, 0.54], ("bert", 2): [0.551, 0.561, 0.541]}
ACC = {("gpt", 1): [0.70, 0.72, 0.71], ("bert", 1): [0.80, 0.79, 0.83],
       ("gpt", 2): [0.75, 0.75, 0.76], ("bert", 2): [0.75, 0.76, 0.76]}


def _spec() -> Spec:
    names = [f"{a}-{t}" for t in ("tok1e6", "tok2e6") for a in ("gpt", "bert")]
    return Spec(name="x", arms=[ArmSpec(n) for n in names], budget=B1, tune=Tune(lr=[1e-3, 2e-3]),
                reference="gpt-tok1e6", out="o", spec_path="", seeds=[0, 1, 2], budgets=[B1, B2],
                finetune=Finetune(["train.objective=classify"], Budget("tokens", 1e5), Tune(lr=[1e-3, 2e-3])))


def _results() -> list[dict]:
    out = []
    for (arm, b), losses in LOSS.items():
        for s, loss in enumerate(losses):
            out.append({"arm": f"{arm}-tok{b}e6", "seed": s, "lr": 1e-3, "point": f"{arm}{b}s{s}",
                        "result": {"loss": loss, "accuracy": ACC[(arm, b)][s], "examples": 100,
                                   "baselines": {"chance": 0.5, "majority": 0.51}, "pooling": "last",
                                   "model_type": "decoder"}})
    return out


def _t(values, level=0.95):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n), sd


def test_each_budget_gets_its_arms_intervals_and_its_own_reference():
    s = summarise(_spec(), _results())
    assert [g["reference"] for g in s["groups"]] == ["gpt-tok1e6", "gpt-tok2e6"]
    bert = s["groups"][0]["arms"][1]
    mean, half, _ = _t(ACC[("bert", 1)])
    assert bert["accuracy"]["mean"] == pytest.approx(mean)
    assert bert["accuracy"]["high"] - bert["accuracy"]["mean"] == pytest.approx(half)
    assert bert["loss"]["mean"] == pytest.approx(sum(LOSS[("bert", 1)]) / 3)
    assert bert["baselines"]["majority"] == 0.51 and bert["base"] == "bert"


def test_verdicts_read_the_paired_loss_difference_with_holm_over_every_budget():
    s = summarise(_spec(), _results(), margin=0.02)
    v = {r["tag"]: r for r in s["verdicts"]}
    assert set(v) == {"tok1e6", "tok2e6"} and all(r["against"].startswith("gpt-") for r in v.values())
    d1 = [b - a for a, b in zip(LOSS[("gpt", 1)], LOSS[("bert", 1)])]
    mean, _, sd = _t(d1)
    r = v["tok1e6"]
    assert r["scale"] == "nats" and r["mean"] == pytest.approx(mean) and r["sd"] == pytest.approx(sd)
    p = 2 * stats.t.sf(abs(mean) / (sd / math.sqrt(3)), 2)
    assert r["p_difference"] == pytest.approx(p)
    p2 = v["tok2e6"]["p_difference"]
    assert r["p_difference_holm"] == pytest.approx(min(1.0, 2 * min(p, p2)) if p < p2 else max(2 * p2, p))
    # the interval at the Holm level excludes 0 exactly when the Holm-adjusted p is below 0.05
    assert (r["high"] < 0) == (r["p_difference_holm"] < 0.05)
    assert r["class"].startswith("better") == (r["p_difference_holm"] < 0.05)
    # budget 2: bert is gpt + 0.001 nats on every seed: inside the +-0.02 margin
    assert v["tok2e6"]["mean"] == pytest.approx(0.001) and v["tok2e6"]["p_tost"] < 0.05
    acc = r["accuracy"]
    assert acc["mean"] == pytest.approx(sum(b - a for a, b in zip(ACC[("gpt", 1)], ACC[("bert", 1)])) / 3)
    assert acc["seeds"] == [0, 1, 2]


def test_no_budgets_one_group_against_the_spec_reference():
    spec = _spec()
    spec = Spec(**{**spec.__dict__, "budgets": None, "reference": "gpt-tok1e6"})
    s = summarise(spec, _results())
    assert len(s["groups"]) == 1 and len(s["verdicts"]) == 3  # every other arm against the one reference
