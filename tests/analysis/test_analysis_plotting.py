"""analysis.plotting: shared figure helpers."""

from __future__ import annotations

from analysis.plotting import plain_log_ticks, pyplot


def test_plain_log_ticks_label_a_short_log_axis_with_plain_values():
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(0.75, 1.4)
    plain_log_ticks(ax.xaxis, *ax.get_xlim())
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.8", "0.9", "1", "1.1", "1.25"]
    assert list(ax.xaxis.get_minorticklocs()) == []
    plt.close(fig)
    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(1.01, 1.04)  # fewer than 3 plain values fit: matplotlib's own ticks stay
    before = ax.xaxis.get_major_locator()
    plain_log_ticks(ax.xaxis, *ax.get_xlim())
    assert ax.xaxis.get_major_locator() is before
    plt.close(fig)
