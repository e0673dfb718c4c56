"""The figures of the scaling study: loss against compute and tokens, dense vs MoE, IsoFLOP
profiles, the fitted L(N, D) and the compute multipliers. Seed groups are drawn at their mean with
+-1 std error bars; fitted curves only over the range that was measured.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Optional

import numpy as np

from analysis.plotting import count_log_axis, plain_log_axis
from analysis.runs import pyplot, save_figure, style_axes
from analysis.scaling.fits.allocation import allocation
from analysis.scaling.fits.common import NOT_BRACKETED, OK
from analysis.scaling.fits.envelope import envelope

SEED_BARS = "error bars: ±1 std over seeds"


def _plain_log_y(ax) -> None:
    """A log-scaled y axis (loss, multipliers) labelled with plain numbers (3.5, 4) instead of 4x10^0."""
    ax.set_yscale("log")
    plain_log_axis(ax.yaxis)


def _colors(families: list[str]) -> dict[str, str]:
    return {f: f"C{i % 10}" for i, f in enumerate(sorted(families))}


def _marker(is_moe: bool) -> str:
    return "s" if is_moe else "o"


def _log_x(ax, values, count: bool = False) -> None:
    """Log x axis; a single x value gets a factor-2 margin each side (matplotlib cannot span 0 decades).
    ``count`` (parameters, tokens): ticks at plain values written 20k, 1.5M, not crowded minor labels."""
    v = [x for x in values if x > 0]
    if v and max(v) <= min(v) * (1 + 1e-6):
        ax.set_xlim(min(v) / 2, max(v) * 2)
    ax.set_xscale("log")
    if count:
        count_log_axis(ax.xaxis)


def _points(ax, x, y, err, **kw) -> None:
    """Scatter, with error bars where any point has a spread (seed groups)."""
    err = np.asarray(err, dtype=float)
    if np.any(err > 0):
        ax.errorbar(x, y, yerr=err, fmt=kw.pop("marker", "o"), ls="none", capsize=2.5, **kw)
    else:
        ax.scatter(x, y, **kw)


def plot_loss_vs_flops(points, fits, curves, path: Path) -> Path:
    """Left: final loss against training FLOPs with the fitted L(C) and its 95% band.
    Right: validation curves against FLOPs and each family's compute-optimal frontier."""
    plt = pyplot()
    fams = sorted({p.family for p in points} | set(curves))
    col = _colors(fams)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for fam in fams:
        ps = sorted((p for p in points if p.family == fam), key=lambda p: p.flops)
        if not ps:
            continue
        C = np.array([p.flops for p in ps])
        L = np.array([p.loss for p in ps])
        f = fits.get(fam)
        label = f"{fam} runs" + (" (MoE)" if ps[0].is_moe else "")
        _points(ax, C, L, [p.loss_std for p in ps], color=col[fam], marker=_marker(ps[0].is_moe), zorder=3,
                label=label)
        if f is not None and f.status == "ok":
            grid = np.geomspace(C.min(), C.max(), 100)  # the measured range only
            ax.plot(grid, f.predict(grid), color=col[fam], lw=1.5,
                    label=f"{fam} fit: {f.E:.2f} + A·C^-{f.alpha:.2f}")
            band = f.band(grid)
            if band is not None:
                ax.fill_between(grid, band[0], band[1], color=col[fam], alpha=0.15, lw=0)
    all_L = [p.loss for p in points]
    _log_x(ax, [p.flops for p in points])
    _plain_log_y(ax)
    ax.set_ylim(0.97 * min(all_L), 1.05 * max(all_L))  # the band may blow up when extrapolating
    seeds = f"; {SEED_BARS}" if any(p.n_seeds > 1 for p in points) else ""
    style_axes(ax, "Final validation loss vs training compute\n(lines: L(C) = E + A·C^-alpha, band: 95% bootstrap"
               f"{seeds})", "training compute C (FLOPs)", "validation loss (nats/token)")
    for fam in fams:
        for name, _, c, loss in curves.get(fam, []):
            bx.plot(c, loss, color=col[fam], lw=0.8, alpha=0.35)
        if curves.get(fam):
            gc, gl, _ = envelope(curves[fam])
            bx.plot(gc, gl, color=col[fam], lw=2.5, label=f"{fam} frontier (thin: its runs)")
    bx.set_xscale("log")
    _plain_log_y(bx)
    style_axes(bx, "Compute-optimal frontier: lowest loss reached\nwithin a FLOPs budget, over each family's runs",
               "training compute so far (FLOPs)", "validation loss (nats/token)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_loss_vs_tokens(runs_by_family: dict[str, list], path: Path, n_of=None, n_label: str = "active") -> Path:
    """One panel per family: validation loss against tokens seen, one line per run, one colour and
    one legend entry per model size N = ``n_of(run)`` (the fits' N, named ``n_label``; default the
    active count; runs of a size, e.g. a WSD trunk and its branches or several seeds, share them)."""
    if n_of is None:
        def n_of(r):
            return r.params["active"]

    plt = pyplot()
    fams = sorted(runs_by_family)
    fig, axes = plt.subplots(1, len(fams), figsize=(6 * len(fams), 6.4), squeeze=False, sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, fam in zip(axes[0], fams):
        runs = sorted(runs_by_family[fam], key=n_of)
        sizes = sorted({n_of(r) for r in runs})
        labelled: set = set()
        for r in runs:
            rows = [v for v in r.val_rows if v.get("tokens")]
            if not rows:
                continue
            size = n_of(r)
            color = cmap(sizes.index(size) / max(1, len(sizes) - 1) * 0.9)
            n_runs = sum(n_of(q) == size for q in runs)
            label = None if size in labelled else f"N = {size:.3g} ({n_runs} runs)"
            labelled.add(size)
            ax.plot([v["tokens"] for v in rows], [v["loss"] for v in rows], "o-", ms=2.5, lw=1, color=color,
                    alpha=0.8, label=label)
        ax.set_xscale("log")
        style_axes(ax, f"{fam}: validation loss vs tokens", "tokens seen (count)", "validation loss (nats/token)",
                   legend_title="\n".join(textwrap.wrap(f"model size N: {n_label}", 50)), legend_below=2)
    fig.tight_layout()
    return save_figure(fig, path)


def dense_vs_moe_skip(points) -> Optional[str]:
    """Why dense_vs_moe.png would have nothing to show (None: it has): it needs a dense and an MoE family."""
    kinds = {p.is_moe for p in points}
    if True not in kinds:
        return "no MoE run among the points"
    if False not in kinds:
        return "no dense run among the points"
    return None


def plot_dense_vs_moe(points, fits, path: Path, n_of=None,
                      n_label: str = "active parameters per token, embeddings included") -> Optional[Path]:
    """Left: loss against training FLOPs (equal compute). Right: loss against active parameters
    per token ``n_of(point)``, named ``n_label`` (equal active size), lines joining runs of one
    family with the same token count. None (nothing written) without both a dense and an MoE family
    (:func:`dense_vs_moe_skip`)."""
    if dense_vs_moe_skip(points):
        return None
    if n_of is None:
        def n_of(p):
            return p.params_active

    plt = pyplot()
    fams = sorted({p.family for p in points})
    col = _colors(fams)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for fam in fams:
        ps = sorted((p for p in points if p.family == fam), key=lambda p: p.flops)
        moe = ps[0].is_moe
        kind = "MoE" if moe else "dense"
        _points(ax, [p.flops for p in ps], [p.loss for p in ps], [p.loss_std for p in ps], color=col[fam],
                marker=_marker(moe), zorder=3, label=f"{fam} ({kind})")
        f = fits.get(fam)
        if f is not None and f.status == "ok":
            grid = np.logspace(np.log10(ps[0].flops), np.log10(ps[-1].flops), 60)
            ax.plot(grid, f.predict(grid), color=col[fam], ls="--" if moe else "-", lw=1.3)
        # one line per token budget, or per FLOPs budget in a FLOPs sweep (there tokens differ per size)
        def key(p):
            return ("flops", p.budget) if p.budget else ("tokens", round(p.tokens, -3))

        budgets = sorted({key(p) for p in ps})
        for i, k in enumerate(budgets):  # one legend entry per family: its lines differ only in the budget
            same = sorted((p for p in ps if key(p) == k), key=n_of)
            unit = "FLOPs" if k[0] == "flops" else "tokens"
            bx.plot([n_of(p) for p in same], [p.loss for p in same], color=col[fam],
                    marker=_marker(moe), ls="--" if moe else "-",
                    label="_nolegend_" if i else
                    f"{fam} ({kind}): {len(budgets)} {'budgets' if len(budgets) > 1 else 'budget'} "
                    f"{budgets[0][1]:.3g}-{budgets[-1][1]:.3g} {unit}")
    _log_x(ax, [p.flops for p in points])
    _log_x(bx, [n_of(p) for p in points], count=True)
    style_axes(ax, "Dense vs MoE at equal training compute\n(lines: fitted L(C), dashed for MoE)",
               "training compute C (FLOPs)", "final validation loss (nats/token)")
    style_axes(bx, "Dense vs MoE at equal active parameters\n(MoE: K routed + shared experts + router; "
               "lines: one budget each, lower = larger budget)",
               f"N: {n_label} (count)", "final validation loss (nats/token)", legend_below=1)
    fig.tight_layout()
    return save_figure(fig, path)


def _note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, wrap=True,
            bbox=dict(boxstyle="round", fc="#f4f4f4", ec="#bbbbbb"))


def _ci_text(v, ci, fmt=".3f") -> str:
    return f"{v:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")


def _open_ends(ax, n_opt: float, at: float, ci, lo_lim: float, hi_lim: float, color, axis: str) -> tuple:
    """The interval of N* clipped to [lo_lim, hi_lim] (a bootstrap whose parabolas did not all open upward
    leaves it unbounded: 0 or inf); each clipped end gets an arrowhead pointing on, at N* = the end on
    ``axis`` ("x": N on the x axis at height ``at``; "y": N on the y axis at ``at`` on the x axis)."""
    if not ci:
        return n_opt, n_opt
    lo, hi = max(ci[0], lo_lim), min(ci[1], hi_lim)
    down, up = ("<", ">") if axis == "x" else ("v", "^")
    for end, cut, arrow in ((lo, ci[0] < lo, down), (hi, ci[1] > hi, up)):
        if cut:
            ax.plot(*(([end], [at]) if axis == "x" else ([at], [end])), marker=arrow, ms=6, color=color, zorder=4)
    return lo, hi


def plot_isoflop(studies: dict, n_label: str, path: Path) -> Path:
    """One row per family. Left: loss against N, one colour per compute budget, the fitted
    parabolas and their minima N* (stars, with 95% intervals). Right: N* against C with the
    fitted N*(C) ∝ C^a and, dashed, approach 3's N_opt(C) from L(N, D)."""
    plt = pyplot()
    fams = sorted(studies)
    fig, axes = plt.subplots(len(fams), 2, figsize=(13, 6.0 * len(fams)), squeeze=False)
    cmap = plt.get_cmap("plasma")
    for (ax, bx), fam in zip(axes, fams):
        st = studies[fam]
        iso = st.iso
        profs = iso.profiles
        bars = any(e > 0 for p in profs for e in p.L_err)
        for j, p in enumerate(profs):
            color = cmap(0.85 * j / max(1, len(profs) - 1))
            label = f"C = {p.budget:.3g} FLOPs" + (f" ({p.status})" if p.status != OK else
                                                   f" ({NOT_BRACKETED})" if p.flags else "")
            if bars:  # every budget drawn alike, so that the legend keeps the budgets' order
                ax.errorbar(p.N, p.L, yerr=p.L_err, fmt="o", ls="none", capsize=2.5, color=color, zorder=3,
                            label=label)
            else:
                ax.scatter(p.N, p.L, color=color, marker="o", zorder=3, label=label)
            if p.coef is not None and p.coef[0] > 0:
                grid = np.geomspace(min(p.N), max(p.N), 80)  # the sizes trained only
                ax.plot(grid, p.curve(grid), color=color, lw=1.2)
            if p.N_opt is not None and p.status == OK:  # a minimum outside the sizes trained is not drawn
                ci = p.ci.get("N_opt")
                lo, hi = _open_ends(ax, p.N_opt, p.L_opt, ci, min(p.N) / 2, max(p.N) * 2, color, "x")
                ax.errorbar([p.N_opt], [p.L_opt], xerr=None if not ci else [[p.N_opt - lo], [hi - p.N_opt]], fmt="*",
                            ms=13, color=color, mec="black", capsize=3, zorder=4,
                            mfc="none" if p.flags else color)  # hollow: no trained size on one side of it
        _log_x(ax, [n for p in profs for n in p.N], count=True)
        if not profs:
            _note(ax, "no finite points")
        style_axes(ax, f"{fam}: IsoFLOP profiles (approach 2)\nparabola in ln N per budget,\n"
                   "★ = minimum N* (inside the sizes trained) with 95% interval"
                   + (f"\nhollow ★: {NOT_BRACKETED} by the sizes" if any(p.flags and p.status == OK for p in profs)
                      else ""), f"N: {n_label} (count)",
                   "final validation loss (nats/token)", legend_title="budget",
                   legend_below=2)  # the profiles fill the panel's upper left, where small budgets rise
        used = [p for p in profs if p.status == OK]
        if used:
            C = np.array([p.budget for p in used])
            Nopt = np.array([p.N_opt for p in used])
            ends = [_open_ends(bx, n, c, p.ci.get("N_opt", [n, n]), min(st.N) / 2, max(st.N) * 2, "C0", "y")
                    for p, n, c in zip(used, Nopt, C)]
            bx.errorbar(C, Nopt, yerr=[Nopt - np.array([e[0] for e in ends]), np.array([e[1] for e in ends]) - Nopt],
                        fmt="o", color="C0", capsize=3, zorder=3, label="N* per budget (95% interval)")
        grid = None
        if iso.power_law is not None and iso.power_law.status == OK:
            pl = iso.power_law
            grid = np.geomspace(C.min(), C.max(), 60)  # the budgets fitted only
            bx.plot(grid, pl.predict(grid), color="C0", lw=1.5,
                    label=f"approach 2: N* ∝ C^a, a = {_ci_text(pl.slope, pl.ci.get('slope'))}")
            band = pl.band(grid)
            if band is not None:
                bx.fill_between(grid, band[0], band[1], color="C0", alpha=0.15, lw=0)
        opt = st.nd.status == OK and st.nd.alpha > 0 and st.nd.beta > 0
        measured = st.budget_compute == "measured" and st.fpt is not None and st.optimum.status == OK
        if opt:
            g = grid if grid is not None else np.geomspace(min(st.C), max(st.C), 60)
            f = st.nd
            if measured:  # budgets in measured FLOPs: N_opt at each size's own F, as the allocation table
                n_opt = [float(allocation(f.E, f.A, f.alpha, f.B, f.beta, c, st.fpt)["N_opt"][0]) for c in g]
                bx.plot(g, n_opt, color="C3", ls="--", lw=1.3,
                        label="approach 3: N_opt from L(N, D) at measured FLOPs, a = "
                              f"{_ci_text(st.optimum.a, st.optimum.ci.get('a'))}")
            else:
                G = (f.alpha * f.A / (f.beta * f.B)) ** (1 / (f.alpha + f.beta))
                k = st.k_budget or st.k  # in the budgets' own C = k N D, so that both approaches share the x axis
                bx.plot(g, G * (g / k) ** f.a_opt, color="C3", ls="--", lw=1.3,
                        label=f"approach 3: N_opt from L(N, D), C = {k:.3g}·N·D, a = "
                              f"{_ci_text(f.a_opt, f.ci.get('a_opt'))}")
        bx.set_xscale("log")
        bx.set_yscale("log")
        count_log_axis(bx.yaxis)
        if not used and not opt:
            _note(bx, f"no N*(C) fit: {iso.status}\n{iso.message}")
        fit_status = iso.status if not iso.flags else f"{NOT_BRACKETED} at {sum(bool(p.flags) for p in used)} budget(s)"
        style_axes(bx, f"{fam}: compute-optimal size against compute\n(N*(C) fit: {fit_status}"
                   + ("; left: error bars ±1 std over seeds" if bars else "") + ")",
                   "compute budget C (measured training FLOPs)" if st.budget_compute == "measured"
                   else f"compute budget C (FLOPs, C = {st.k_budget:.3g}·N·D as the sweep counts it)" if st.k_budget
                   else "training compute C (FLOPs)", "\n".join(textwrap.wrap(f"optimal N*: {n_label} (count)", 42)))
    fig.tight_layout()
    return save_figure(fig, path)


def plot_loss_nd(studies: dict, n_label: str, path: Path) -> Path:
    """One panel per family: final loss against tokens D, one colour per model size N, with the
    fitted L(N, D) = E + A/N^alpha + B/D^beta drawn for each size."""
    plt = pyplot()
    fams = sorted(studies)
    fig, axes = plt.subplots(1, len(fams), figsize=(6.5 * len(fams), 7), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, fam in zip(axes[0], fams):
        st = studies[fam]
        sizes = sorted(set(st.N))
        D_all = np.asarray(st.D)
        for i, n in enumerate(sizes):
            color = cmap(0.9 * i / max(1, len(sizes) - 1))
            sel = [j for j, m in enumerate(st.N) if m == n]
            ax.errorbar(D_all[sel], np.asarray(st.L)[sel], yerr=np.asarray(st.L_err)[sel], fmt="o", ls="none",
                        capsize=2.5, color=color, zorder=3, label=f"N = {n:.3g}")  # all alike: the legend in N order
            if st.nd.status == OK and D_all[sel].max() > D_all[sel].min():  # each size's curve over its own tokens only
                grid = np.geomspace(D_all[sel].min(), D_all[sel].max(), 60)
                ax.plot(grid, st.nd.predict(n, grid), color=color, lw=1.1)
        _log_x(ax, st.D, count=True)
        _plain_log_y(ax)
        f = st.nd
        if f.status == OK:
            head = [f"{fam}: L(N, D) = {f.E:.3g} + {f.A:.3g}/N^{f.alpha:.3f} + {f.B:.3g}/D^{f.beta:.3f}",
                    f"lines: fit (Huber on log L), rms log residual {f.rms_log_residual:.3g}"]
        else:
            head = [f"{fam}: no L(N, D) fit: {f.status}", *textwrap.wrap(f.message, 60)[:3]]
            if not st.N:
                _note(ax, f.message)
        if any(e > 0 for e in st.L_err):
            head.append(SEED_BARS)
        style_axes(ax, "\n".join(head), "training tokens D (count)", "final validation loss (nats/token)",
                   legend_title=f"N: {n_label}", legend_below=3)
    fig.tight_layout()
    return save_figure(fig, path)


def compute_multiplier_skip(curves: list) -> Optional[str]:
    """Why compute_multiplier.png would have nothing to show (None: it has): no pair of families, or no pair
    with fits over a common compute range."""
    if not curves:
        return "one family: no pair to compare (give two families, e.g. --pairs REF:FAM)"
    if not any(c.status == OK and c.C for c in curves):
        return "no pair with fits over a common compute range (" + ", ".join(
            sorted({f"{c.family} vs {c.reference}: {c.status}" for c in curves})) + ")"
    return None


def plot_compute_multiplier(curves: list, n_labels: dict, path: Path) -> Optional[Path]:
    """One panel per N definition: each pair's compute multiplier m(C) with its 95% band, over the
    compute both families measured only (no extrapolation); m = 1 is drawn dashed. None (nothing
    written) when no pair has a curve (:func:`compute_multiplier_skip`)."""
    if compute_multiplier_skip(curves):
        return None
    plt = pyplot()
    kinds = list(dict.fromkeys(c.n_kind for c in curves))
    pairs = list(dict.fromkeys((c.reference, c.family) for c in curves))
    fig, axes = plt.subplots(1, len(kinds), figsize=(6.5 * len(kinds), 6.2), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        mine = [c for c in curves if c.n_kind == kind]
        drawn = [c for c in mine if c.status == OK and c.C]
        for c in drawn:
            color = f"C{pairs.index((c.reference, c.family)) % 10}"  # one colour per pair in every panel
            name = f"{c.family} vs {c.reference}"
            ax.plot(c.C, c.multiplier, color=color, lw=1.8, label=name)
            if c.lo:
                ax.fill_between(c.C, c.lo, c.hi, color=color, alpha=0.18, lw=0, label=f"{name}: 95% band")
        if drawn:
            ax.axhline(1.0, color="grey", ls="--", lw=1, label="m = 1: equally efficient")
            ax.set_xscale("log")
            _plain_log_y(ax)
        else:
            _note(ax, "no pair with fits over a common compute range:\n"
                  + "\n".join(f"{c.family} vs {c.reference}: {c.status}" for c in mine) if mine else "one family")
        label = n_labels.get(kind, kind)
        style_axes(ax, "\n".join(textwrap.wrap(f"Compute multiplier, fits with N = {label}", 60)
                                 + ["(reference's FLOPs / family's FLOPs, at the family's compute-optimal loss)"]),
                   "training compute C of the family (FLOPs)", "compute multiplier m (×)",
                   legend_below=2)  # below the panel: the bands fill it
    fig.tight_layout()
    return save_figure(fig, path)
