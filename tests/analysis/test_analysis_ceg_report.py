"""analysis.ceg_report.compare: which arm each verdict is read against (the reference, a compare: partner,
a ladder's parent), arms of another objective and side arms left out of the family, and a step's CEG
against its parent from one paired inference."""

from __future__ import annotations

from types import SimpleNamespace as Namespace

import pytest

from analysis import ceg_report, verdicts
from analysis.experiment_spec import Arm, Ceg, Margin


def _spec(verdicts: str = "reference", ceg=None):
    """The spec fields compare reads: an equivalence margin of 0.02 nats, the verdicts' family, the curve."""
    return Namespace(margin=Margin("nats", 0.02), verdicts=verdicts, ceg=ceg, sequential=None)


def _arms(**fields) -> dict:
    """{name: Arm} with the fields compare reads (``parent``, ``compare``, ``side``), the rest left empty."""
    return {name: Arm(name=name, label=name, recipe="", overrides=[], own=[], **f) for name, f in fields.items()}


class _Group:
    def __init__(self, arm: str, losses: dict, metric: str = "loss"):
        self.arm, self._losses, self.runs, self.metric = arm, losses, {}, metric

    def losses(self) -> dict:
        return self._losses


def test_pairs_verdicts_test_each_arm_against_its_compare_arm():
    """Muon 0.10 nats below AdamW on every seed, MTP equal to next-token: with verdicts: pairs each is tested
    against its own partner (against the reference, the MTP arm would be 'worse' by 0.3 nats)."""
    from types import SimpleNamespace

    losses = {"adamw": {0: 4.00, 1: 4.02, 2: 3.98, 3: 4.01}, "muon": {0: 3.90, 1: 3.921, 2: 3.879, 3: 3.911},
              "ds": {0: 4.30, 1: 4.32, 2: 4.28, 3: 4.31}, "ds-mtp": {0: 4.301, 1: 4.319, 2: 4.2805, 3: 4.3101}}
    groups = {a: _Group(a, v) for a, v in losses.items()}
    arms = _arms(adamw={}, muon={"compare": "adamw"}, ds={}, **{"ds-mtp": {"compare": "ds"}})
    for mode, expected in [("pairs", {"muon": ("adamw", "better"), "ds-mtp": ("ds", "equivalent")}),
                           ("reference", {"muon": ("adamw", "better"), "ds": ("adamw", "worse"),
                                          "ds-mtp": ("adamw", "worse")})]:
        ctx = SimpleNamespace(spec=_spec(verdicts=mode), reference="adamw", arms=arms,
                              group=groups.get, arm_groups=lambda: list(groups.values()), curve_rows=[])
        out = ceg_report.compare(ctx)
        got = {a: (c["verdict"]["against"], c["class"].split()[0]) for a, c in out["arms"].items()}
        assert got == expected, mode


def test_verdicts_leave_out_arms_of_another_objective():
    """A masked-LM arm's mlm_loss is not tested against a causal LM's loss, however the numbers compare."""
    from types import SimpleNamespace

    groups = {"gpt": _Group("gpt", {0: 4.0, 1: 4.1, 2: 4.05}), "gpt-8": _Group("gpt-8", {0: 3.9, 1: 3.95, 2: 3.92}),
              "bert": _Group("bert", {0: 5.0, 1: 5.1, 2: 5.05}, metric="mlm_loss")}
    ctx = SimpleNamespace(spec=_spec(), reference="gpt", arms=_arms(**{a: {} for a in groups}),
                          group=groups.get, arm_groups=lambda: list(groups.values()), curve_rows=[])
    out = ceg_report.compare(ctx)
    assert set(out["arms"]) == {"gpt-8"} and out["arms"]["gpt-8"]["class"].startswith("better")


def test_side_arms_are_tested_only_against_their_compare_arm():
    """A time-matched control (side, no compare:) joins no family; a side arm naming compare: is tested
    against that arm, not the reference."""
    from types import SimpleNamespace

    groups = {"dense": _Group("dense", {0: 4.0, 1: 4.1, 2: 4.05}), "moe": _Group("moe", {0: 3.9, 1: 3.95, 2: 3.92}),
              "dense-time": _Group("dense-time", {0: 4.1, 1: 4.2, 2: 4.15}),
              "deep": _Group("deep", {0: 3.7, 1: 3.75, 2: 3.72})}
    arms = _arms(dense={}, moe={}, deep={"side": True, "compare": "moe"}, **{"dense-time": {"side": True}})
    ctx = SimpleNamespace(spec=_spec(), reference="dense", arms=arms, group=groups.get,
                          arm_groups=lambda: list(groups.values()), curve_rows=[])
    out = ceg_report.compare(ctx)
    assert {a: c["verdict"]["against"] for a, c in out["arms"].items()} == {"moe": "dense", "deep": "moe"}


def test_parent_verdicts_test_each_step_of_a_ladder_against_the_step_before():
    """verdicts: parent: a ladder a -> b -> c where b improves on a by 0.3 nats and c equals b: c is
    'equivalent' to its parent (against the reference a it would be 'better')."""
    from types import SimpleNamespace

    groups = {"a": _Group("a", {0: 4.30, 1: 4.32, 2: 4.28, 3: 4.31}),
              "b": _Group("b", {0: 4.00, 1: 4.02, 2: 3.98, 3: 4.01}),
              "c": _Group("c", {0: 4.001, 1: 4.019, 2: 3.9805, 3: 4.0101})}
    arms = _arms(a={"parent": None}, b={"parent": "a"}, c={"parent": "b"})
    ctx = SimpleNamespace(spec=_spec(verdicts="parent"), reference="a", arms=arms,
                          group=groups.get, arm_groups=lambda: list(groups.values()), curve_rows=[])
    out = ceg_report.compare(ctx)
    got = {a: (c["verdict"]["against"], c["class"].split()[0]) for a, c in out["arms"].items()}
    assert got == {"b": ("a", "better"), "c": ("b", "equivalent")}
    assert out["family"] == "every step against the arm it extends"


def test_parent_verdicts_give_each_step_its_ceg_against_its_parent():
    """A ladder a -> b -> c on a's measured curve L(C) = 3 + (C / 1e12)^-0.3: b is worth 2x a's compute and
    c 3x, so c's CEG against its parent b is 1.5x; against the reference a the plain CEG is the answer."""
    from types import SimpleNamespace

    def loss(c):
        return 3.0 + (c / 1e12) ** -0.3

    luck = {0: 0.004, 1: -0.003, 2: 0.001, 3: -0.002}  # each seed's shared luck
    rows = [{"arm": "a", "role": "ceg-cooldown", "status": "finished", "learned": True, "seed": s,
             "training_flops": c, "val_loss": loss(c) + luck[s]} for s in luck for c in (0.5e12, 1e12, 2e12, 4e12)]
    groups = {a: _Group(a, {s: loss(k * 1e12) + luck[s] for s in luck}) for a, k in (("a", 1), ("b", 2), ("c", 3))}
    for g in groups.values():
        g.runs = {s: {"status": "finished", "training_flops": 1e12} for s in luck}
    arms = _arms(a={"parent": None}, b={"parent": "a"}, c={"parent": "b"})
    ctx = SimpleNamespace(spec=_spec(verdicts="parent", ceg=Ceg(fractions=[1], seeds=[0])),
                          reference="a", arms=arms, group=groups.get, arm_groups=lambda: list(groups.values()),
                          curve_rows=rows)
    out = ceg_report.compare(ctx)
    b, c = out["arms"]["b"], out["arms"]["c"]
    assert b["verdict"]["against"] == "a" and b["ceg"]["ceg"] == pytest.approx(2.0, rel=0.02)
    rel = c["verdict"]  # c's verdict is against its parent b, from the same paired inference as its interval
    assert rel["against"] == "b" and rel["scale"] == "ln CEG"
    assert rel["ceg"] == pytest.approx(1.5, rel=0.02) and rel["ceg_low"] < 1.5 < rel["ceg_high"]
    assert c["ceg"]["ceg"] == pytest.approx(3.0, rel=0.02)  # against the reference: the plain CEG
    assert verdicts.fmt_interval(rel).startswith("1.5")
