"""analysis.experiment_report: the main table's verdict cell says which arm the verdict was read against, with
that comparison's own interval, when the row's difference and CEG columns are against another (the reference)."""

from __future__ import annotations

from types import SimpleNamespace

from analysis.experiment_report import verdict_cell
from analysis.experiment_spec import Arm


def _ctx(verdicts: str):
    arms = {name: Arm(name=name, label=name, recipe="", overrides=[], own=[], **f) for name, f in {
        "vanilla": {}, "pre-ln": {"parent": "vanilla"}, "learned": {"parent": "pre-ln"},
        "post-ln-learned": {"parent": "vanilla", "side": True, "compare": "learned"}}.items()}
    return SimpleNamespace(spec=SimpleNamespace(verdicts=verdicts), arms=arms, reference="vanilla")


def _comparison(against: str, cls: str) -> dict:
    return {"class": cls, "verdict": {"against": against, "scale": "nats", "mean": 0.5, "low": 0.3, "high": 0.7,
                                      "alpha_interval": 0.005}}


def test_a_verdict_in_a_ladder_names_its_arm_and_carries_its_own_interval():
    """The rows' difference and CEG columns are against the reference (vanilla): a step's verdict is against its
    parent, a side arm's against its compare arm; each cell says so with that comparison's interval."""
    ctx = _ctx("parent")
    side = verdict_cell(ctx, _comparison("learned", "worse"))
    assert side == "worse vs `learned`: +0.500 nats [+0.300, +0.700] at 99.5%"
    assert verdict_cell(ctx, _comparison("pre-ln", "better")).startswith("better vs `pre-ln`: ")
    assert verdict_cell(ctx, _comparison("vanilla", "better")) == "better"  # the columns' own comparison
    assert verdict_cell(ctx, {}) == "-"


def test_a_verdict_against_the_reference_is_printed_alone_in_every_family():
    """The columns beside the cell are that comparison's; a pair's verdict against another arm names it."""
    for mode in ("reference", "pairs", "parent"):
        assert verdict_cell(_ctx(mode), _comparison("vanilla", "better")) == "better"
    assert verdict_cell(_ctx("pairs"), _comparison("learned", "worse")).startswith(
        "worse vs `learned`: +0.500 nats")


def test_a_run_above_the_unigram_entropy_is_not_called_within_the_margin_of_it():
    """learned = loss < unigram - 0.1: a loss 1.1 nats above the unigram entropy did not learn, and the
    reason says so rather than 'within 0.1 nats'."""
    from analysis.experiment_report import unlearned_why

    why = unlearned_why(5.951, 4.840)
    assert "within" not in why and "is not 0.1 nats below the unigram entropy 4.840 (1.111 nats above it)" in why


def test_a_quick_report_is_titled_a_smoke_test():
    from analysis.experiment_report import report_title

    assert report_title(SimpleNamespace(title="MoE against dense", name="m", quick=True)).startswith("Smoke test")
    assert report_title(SimpleNamespace(title="MoE against dense", name="m", quick=False)) == "MoE against dense"


def test_seconds_under_one_print_with_their_digits_not_as_zero():
    """The report's training seconds (``fmt_ci(..., 0)``): a quick run's 0.43 s is not '0'."""
    from analysis.experiments import fmt_ci, t_interval

    assert fmt_ci(t_interval([0.43]), 0) == "0.43 (1 seed)" and fmt_ci(t_interval([0.58]), 0) == "0.58 (1 seed)"
    assert fmt_ci(t_interval([3.42]), 0) == "3.4 (1 seed)" and fmt_ci(t_interval([89.2]), 0) == "89 (1 seed)"
    assert fmt_ci(t_interval([0.0]), 0) == "0 (1 seed)" and fmt_ci(t_interval([0.0004]), 3) == "0.00040 (1 seed)"


def test_the_loss_note_states_the_did_not_learn_rule():
    from analysis.experiment_report import loss_note

    g = SimpleNamespace(measured=lambda: {"did_not_learn": 1}, vs_compare=None, runs={0: {"status": "finished"}})
    note = loss_note(g)
    assert "1 of 1 did not learn (final loss not 0.1 nats below the unigram entropy)" == note
