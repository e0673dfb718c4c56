"""Shared plot style for the analysis programs: every figure gets a title, labelled axes with
units and a legend, and is written atomically as a PNG.

    plt = pyplot()
    fig, ax = plt.subplots()
    stacked_bars(ax, ["a", "b"], {"part 1": [1, 2], "part 2": [3, 1]})
    style_axes(ax, "What it shows", "recipe", "value (unit)")
    save_figure(fig, out / "figure.png")
"""

from __future__ import annotations

import math
import os
import textwrap
from pathlib import Path
from typing import Optional, Sequence

# one colour per series position, stable across figures (matplotlib's tab10, then two more)
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf", "#393b79", "#e7ba52"]


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def style_axes(ax, title: str, xlabel: str, ylabel: str, legend: bool = True,
               legend_title: Optional[str] = None, legend_outside: bool = False,
               legend_reversed: bool = False, grid: str = "y", legend_below: int = 0) -> None:
    """Title, axis labels (state the unit in them), light grid (``grid="y"`` for bars, ``"both"``
    for curves on log axes), and the legend (outside the axes on the right with
    ``legend_outside``; under the x label in ``legend_below`` columns, when one entry per size or budget
    would fill the panel; ``legend_reversed`` lists stacked series top first)."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if grid == "both":
        ax.grid(alpha=0.3, which="both")
    else:
        ax.grid(alpha=0.3, axis=grid)
    ax.set_axisbelow(True)
    handles, labels = ax.get_legend_handles_labels()
    if legend and handles:
        if legend_reversed:
            handles, labels = handles[::-1], labels[::-1]
        kwargs = dict(loc="upper left", bbox_to_anchor=(1.01, 1.0)) if legend_outside else {}
        if legend_below:
            kwargs = dict(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=legend_below)
        ax.legend(handles, labels, fontsize=8, title=legend_title, title_fontsize=8, **kwargs)


def stacked_bars(ax, labels: Sequence[str], parts: dict[str, Sequence[float]], width: float = 0.6,
                 headroom: float = 1.0) -> None:
    """One bar per label, stacked from ``parts`` (series name -> one value per label); series
    that are zero everywhere are left out of the bars and the legend. ``headroom`` > 1 raises
    the top of the y axis to that multiple of the tallest bar (room for a legend inside)."""
    bottom = [0.0] * len(labels)
    for i, (name, values) in enumerate(parts.items()):
        if not any(values):
            continue
        ax.bar(labels, values, width, bottom=bottom, label=name, color=COLORS[i % len(COLORS)])
        bottom = [b + v for b, v in zip(bottom, values)]
    if headroom > 1.0 and max(bottom, default=0.0) > 0:
        ax.set_ylim(0, headroom * max(bottom))
    if len(labels) > 3:
        ax.tick_params(axis="x", labelrotation=30)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")


def unit_scale(values: Sequence[float], units: Sequence[tuple[float, str]]) -> tuple[float, str]:
    """The largest (factor, unit) of ``units`` (ascending) that the largest value reaches, so that
    axis numbers stay readable: unit_scale([3e9], [(1, "FLOP"), (1e6, "MFLOP"), (1e9, "GFLOP")])."""
    top = max((abs(v) for v in values), default=0.0)
    chosen = units[0]
    for factor, unit in units:
        if top >= factor:
            chosen = (factor, unit)
    return chosen


def _label_collisions(axis, renderer) -> int:
    """Pairs of neighbouring visible tick labels of one axis that overlap on the canvas. Unrotated labels
    collide when their boxes intersect (by more than a pixel); rotated ones, which run parallel, when their
    spacing across the text is under its height."""
    labels = [t for t in axis.get_ticklabels(which="both") if t.get_visible() and t.get_text().strip()]
    boxes = [(t, t.get_window_extent(renderer)) for t in labels]
    vertical = axis.axis_name == "y"
    boxes.sort(key=lambda tb: tb[1].y0 if vertical else tb[1].x0)
    hits = 0
    for (t1, b1), (t2, b2) in zip(boxes, boxes[1:]):
        angle = math.radians(t1.get_rotation() % 180)
        if not vertical and 0.05 < angle < math.pi - 0.05:  # rotated x labels: parallel slanted lines of text
            height = t1.get_fontsize() * axis.figure.dpi / 72 * (t1.get_text().count("\n") + 1)
            spacing = abs((b2.x1 - b1.x1) if t1.get_ha() == "right" else (b2.x0 - b1.x0))
            hits += spacing * abs(math.sin(angle)) < 0.95 * height
        else:
            w = min(b1.x1, b2.x1) - max(b1.x0, b2.x0)
            h = min(b1.y1, b2.y1) - max(b1.y0, b2.y0)
            hits += w > 1 and h > 1
    return hits


def tick_label_overlaps(fig) -> list[str]:
    """Every axis of ``fig`` (colour bars included) whose tick labels overlap, after a draw, as
    "panel title: x axis (labels ...)"; empty when none do."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        for axis in (ax.xaxis, ax.yaxis):
            if _label_collisions(axis, renderer):
                shown = [t.get_text() for t in axis.get_ticklabels(which="both") if t.get_visible()][:6]
                out.append(f"{ax.get_title() or ax.get_label()}: {axis.axis_name} axis ({', '.join(shown)})")
    return out


def thin_tick_labels(fig, rounds: int = 4) -> None:
    """Make the tick labels of every axis of ``fig`` stand apart: on a log axis first drop the minor labels
    (3x10^11 4x10^11 ...), then keep fewer decades; on a numeric axis fewer, rounder ticks; named x ticks
    (categories) are slanted, then set upright, never dropped."""
    from matplotlib.ticker import FixedLocator, LogLocator, MaxNLocator, NullFormatter

    for _ in range(rounds):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        changed = False
        for ax in fig.axes:
            if not ax.get_visible() or not ax.axison:
                continue
            for axis in (ax.xaxis, ax.yaxis):
                if not _label_collisions(axis, renderer):
                    continue
                n = sum(t.get_visible() and bool(t.get_text()) for t in axis.get_majorticklabels())
                if axis.get_scale() == "log" and any(t.get_text() for t in axis.get_minorticklabels()):
                    axis.set_minor_formatter(NullFormatter())
                elif isinstance(axis.get_major_locator(), FixedLocator):
                    rotation = axis.get_majorticklabels()[0].get_rotation() if n else 0
                    if axis.axis_name == "x" and rotation < 90:
                        for t in axis.get_majorticklabels():
                            t.set_rotation(30 if rotation < 30 else 90)
                            t.set_horizontalalignment("right" if rotation < 30 else "center")
                    else:
                        continue
                elif axis.get_scale() == "log":
                    axis.set_major_locator(LogLocator(base=10, numticks=max(2, n // 2 + 1)))
                else:
                    axis.set_major_locator(MaxNLocator(nbins=max(2, n // 2), steps=[1, 2, 2.5, 5, 10]))
                changed = True
        if not changed:
            return


def save_figure(fig, path: Path, dpi: int = 110) -> Path:
    """Write a PNG atomically (tmp + os.replace) and close the figure; tick labels that would overlap are
    thinned first (:func:`thin_tick_labels`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.set_dpi(dpi)  # the labels are measured at the resolution they are written at
    thin_tick_labels(fig)
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    os.replace(tmp, path)
    return path


# mantissas of the plain values a log axis is labelled at, coarse to fine (1, 2, 5 times a power of ten ...)
PLAIN_MANTISSAS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
                   (1.0, 1.1, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))


def plain_ticks(low: float, high: float) -> list[float]:
    """Plain values to label a log axis from ``low`` to ``high`` at (0.8, 0.9, 1, 1.25; 3, 4, 5 nats): those of
    the finest :data:`PLAIN_MANTISSAS` that gives 3 to 12 ticks, all at least 8% of the axis apart; on an
    axis too narrow for 3 of them (0.94-1.02), evenly spaced round numbers (0.94, 0.96 ... 1.02); over more
    than 3 decades, none (decades label such an axis better)."""
    low, high = sorted((low, high))
    if not (low > 0 and math.isfinite(high)) or high / low > 1e3:
        return []
    decades = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
    for mantissas in reversed(PLAIN_MANTISSAS):
        ticks = [t for t in sorted({round(m * 10.0 ** e, 12) for e in decades for m in mantissas})
                 if low * (1 - 1e-9) <= t <= high * (1 + 1e-9)]
        gaps = [math.log(b / a) for a, b in zip(ticks, ticks[1:])]
        if 3 <= len(ticks) <= 12 and min(gaps) >= 0.08 * math.log(high / low):
            return ticks
    from matplotlib.ticker import MaxNLocator

    for bins in (5, 8, 12):
        ticks = [round(float(t), 12) for t in MaxNLocator(nbins=bins, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
                 if low * (1 - 1e-9) <= t <= high * (1 + 1e-9)]
        if len(ticks) >= 3:
            break
    return ticks


def plain_log_axis(axis) -> None:
    """Label a log axis (``ax.xaxis`` / ``ax.yaxis``; loss in nats, ratios) at :func:`plain_ticks` of its final
    limits, written as plain numbers (4, 1.25) instead of 4x10^0, without minor ticks; an axis spanning
    more than 3 decades keeps matplotlib's decade labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullLocator

    class PlainLogLocator(LogLocator):
        def tick_values(self, vmin, vmax):
            return plain_ticks(vmin, vmax) or super().tick_values(vmin, vmax)

    axis.set_major_locator(PlainLogLocator())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(NullLocator())


def si_count(v: float) -> str:
    """A count written short: 2000 -> 2k, 350000 -> 350k, 1.5e6 -> 1.5M (parameters, tokens)."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= scale:
            return f"{v / scale:g}{suffix}"
    return f"{v:g}"


def count_log_axis(axis) -> None:
    """:func:`plain_log_axis` for a count (parameters, tokens): ticks at plain values, written 20k, 1.5M."""
    from matplotlib.ticker import FuncFormatter

    plain_log_axis(axis)
    axis.set_major_formatter(FuncFormatter(lambda v, _: si_count(v)))


def wrap_label(text: str, width: int = 40, lines: int = 2) -> str:
    """A long label (a tick or a legend entry) on at most ``lines`` lines of ``width`` characters, the rest
    shortened to " ..." (the reports' tables hold it whole)."""
    wrapped = textwrap.wrap(text, width) or [text]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines - 1] + [textwrap.shorten(" ".join(wrapped[lines - 1:]), width, placeholder=" ...")]
    return "\n".join(wrapped)
