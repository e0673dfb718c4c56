"""analysis.plotting: shared figure helpers."""

from __future__ import annotations

import pytest

from analysis.plotting import count_log_axis, plain_log_axis, plain_ticks, pyplot, si_count


@pytest.mark.parametrize("low,high,ticks", [
    (0.75, 1.4, [0.8, 0.9, 1.0, 1.1, 1.25]),  # a ratio axis
    (2.8, 7.5, [3.0, 4.0, 5.0, 6.0, 7.0]),  # a loss axis in nats
    (0.935, 1.02, [0.94, 0.96, 0.98, 1.0, 1.02]),  # too narrow for 3 of the mantissas: round numbers
    (3.1, 5.9, [3.5, 4.0, 4.5, 5.0, 5.5]),
    (0.3, 3.0, [0.3, 0.5, 0.7, 1.0, 1.5, 2.0, 3.0]),  # coarser mantissas rather than uneven gaps
    (0.1, 100.0, [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]),  # neighbours >= 8% of the axis apart
    (1e11, 1e15, []),  # over 3 decades: left to the decade labels
])
def test_plain_ticks(low, high, ticks):
    assert plain_ticks(low, high) == pytest.approx(ticks)


def test_plain_log_axis_labels_the_final_limits_with_plain_numbers():
    """The ticks follow limits set after the call (a Locator), printed as 0.9, not 9x10^-1; no minor ticks."""
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    plain_log_axis(ax.xaxis)
    ax.set_xlim(0.75, 1.4)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.8", "0.9", "1", "1.1", "1.25"]
    assert list(ax.xaxis.get_minorticklocs()) == []
    ax.set_xlim(1e2, 1e8)  # six decades: matplotlib's decade ticks
    fig.canvas.draw()
    assert list(ax.get_xticks()[1:-1]) == pytest.approx([10.0 ** k for k in range(2, 9)][: len(ax.get_xticks()) - 2])
    plt.close(fig)


def test_count_log_axis_writes_parameter_counts_short():
    """1.6 decades of parameters (an MoE family's 20k-770k): plain ticks written 20k ... 700k, not 2x10^4."""
    assert [si_count(v) for v in (20, 2000, 350000, 1.5e6, 2e9)] == ["20", "2k", "350k", "1.5M", "2G"]
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    count_log_axis(ax.xaxis)
    ax.set_xlim(2.0e4, 7.7e5)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["20k", "50k", "100k", "200k", "500k"]
    plt.close(fig)


def test_crowded_tick_labels_are_found_and_thinned(tmp_path):
    """A linear axis of 41 long labels and a log axis over one decade labelled at its minor ticks overlap; after
    save_figure's thinning none do, and the axes keep their range."""
    from matplotlib.ticker import LogFormatterSciNotation, MultipleLocator

    from analysis.plotting import pyplot, save_figure, thin_tick_labels, tick_label_overlaps

    plt = pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(6, 3))
    ax.plot([0, 0.01], [0, 1])
    ax.xaxis.set_major_locator(MultipleLocator(0.00025))
    bx.plot([3e11, 9e11], [1, 2])
    bx.set_xscale("log")
    bx.xaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False))
    for a in (ax, bx):
        a.set_title("crowded")
    fig.set_dpi(110)
    before = tick_label_overlaps(fig)
    assert len(before) == 2 and all(": x axis" in b for b in before)
    limits = ax.get_xlim(), bx.get_xlim()
    thin_tick_labels(fig)
    assert tick_label_overlaps(fig) == [] and (ax.get_xlim(), bx.get_xlim()) == limits
    save_figure(fig, tmp_path / "f.png")
