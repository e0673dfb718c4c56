"""Loss against training compute: fitted scaling curves per family, from run folders.

    python -m analysis.scaling runs/sweep-demo --out docs/scaling

For each family (the recipe's ``family``: dense, llama, mixtral, ...) the finished runs give one
point each: C = training FLOPs (tokens seen x the run's training FLOPs per token) and L = final
validation loss (nats/token). Per family we fit

    L(C) = E + A * C^(-alpha)

by robust least squares on log L (Huber loss, Chinchilla approach 3 style), from a grid of
starting points, with 95% bootstrap confidence intervals (resampling the points; with fewer than
six points, resampling the residuals instead, since resampled point sets then almost always
repeat the original). Three parameters need at least four points; a family with fewer is
reported as under-determined and not fitted.
A run that failed, did not finish or diverged is reported and left out of the fits.

Outputs (``--out DIR``): loss_vs_flops.png (log-log, points + fits + frontier), loss_vs_tokens.png
(validation curves), dense_vs_moe.png (equal FLOPs and equal active parameters), fits.json, and
the fitted table printed as markdown (also saved as fits.md).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from scipy.optimize import least_squares, nnls

from analysis.runs import RunError, expand_inputs, pyplot, save_figure, style_axes, write_json_atomic, write_text_atomic

MIN_POINTS = 4  # 3 parameters (E, A, alpha) + at least one degree of freedom
RANGE_SLACK = 1.05  # dense-vs-MoE comparisons reach 5% beyond a dense family's range
PAIRS_MIN_POINTS = 6  # below this, bootstrap the residuals instead of the points (see _bootstrap)


# --------------------------------------------------------------------------------------------
# the fit
# --------------------------------------------------------------------------------------------


@dataclass
class PowerLawFit:
    """L(C) = E + A * C^(-alpha), with C in FLOPs and L in nats/token.

    ``A`` is stated for C in FLOPs; ``A_ref`` is the same amplitude for C measured in units of
    ``c_ref`` (the geometric mean of the fitted C values), which is the better-conditioned number
    to read: at C = c_ref the reducible loss is A_ref.
    """

    n_points: int
    status: str  # "ok" | "under-determined" | "failed"
    message: str = ""
    E: Optional[float] = None
    A: Optional[float] = None
    alpha: Optional[float] = None
    c_ref: Optional[float] = None
    A_ref: Optional[float] = None
    ci: dict = field(default_factory=dict)  # name -> [lo, hi] (95% bootstrap percentile interval)
    n_boot: int = 0  # bootstrap resamples that gave a fit
    ci_method: str = ""  # "points" (pairs bootstrap) or "residuals" (few points), see _bootstrap
    rms_log_residual: Optional[float] = None
    samples: Optional[np.ndarray] = field(default=None, repr=False)  # (n_boot, 3): E, A_ref, alpha

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("samples")
        return d

    def band(self, C: np.ndarray, q: tuple[float, float] = (2.5, 97.5)) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """Pointwise 95% band of the fitted loss at C over the bootstrap fits (None without them)."""
        if self.samples is None or len(self.samples) < 10:
            return None
        x = np.asarray(C, dtype=float)[None, :] / self.c_ref
        s = self.samples
        preds = s[:, :1] + s[:, 1:2] * x ** (-s[:, 2:3])  # (n_boot, len(C))
        return np.percentile(preds, q[0], axis=0), np.percentile(preds, q[1], axis=0)

    def predict(self, C: np.ndarray) -> np.ndarray:
        """Fitted loss at compute C (FLOPs)."""
        if self.status != "ok":
            raise ValueError(f"no fitted curve: {self.status} ({self.message})")
        x = np.asarray(C, dtype=float) / self.c_ref
        return self.E + self.A_ref * x ** (-self.alpha)


def _residuals(theta: np.ndarray, x: np.ndarray, log_L: np.ndarray) -> np.ndarray:
    log_E, log_A, alpha = theta
    return np.log(np.exp(log_E) + np.exp(log_A) * x ** (-alpha)) - log_L


def _jacobian(theta: np.ndarray, x: np.ndarray, log_L: np.ndarray) -> np.ndarray:
    log_E, log_A, alpha = theta
    E, power = np.exp(log_E), np.exp(log_A) * x ** (-alpha)
    m = E + power
    return np.stack([E / m, power / m, -power * np.log(x) / m], axis=1)  # (n, 3)


def _huber(r: np.ndarray, delta: float) -> float:
    a = np.abs(r)
    return float(np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)).sum())


ALPHA_GRID = np.geomspace(1e-3, 5.0, 240)


def _profile_start(x: np.ndarray, L: np.ndarray, huber_delta: float) -> tuple[float, float, float]:
    """A global starting point: for each alpha of a grid, (E, A_ref) >= 0 by iteratively
    reweighted non-negative least squares on relative residuals (~ log residuals, Huber
    weights); keep the alpha with the lowest Huber loss on log L. For fixed alpha the model is
    linear in (E, A_ref), so this explores the flat E-A valley that trips local optimisers."""
    best, best_obj = None, math.inf
    log_L = np.log(L)
    for alpha in ALPHA_GRID:
        M = np.stack([np.ones_like(x), x ** (-alpha)], axis=1) / L[:, None]  # rows: (1, u) / L
        w = np.ones_like(L)
        for _ in range(3):
            (E, A), _ = nnls(M * np.sqrt(w)[:, None], np.sqrt(w))
            r = np.log(np.maximum(E + A * x ** (-alpha), 1e-12)) - log_L
            w = np.where(np.abs(r) <= huber_delta, 1.0, huber_delta / np.maximum(np.abs(r), 1e-300))
        obj = _huber(r, huber_delta)
        if obj < best_obj:
            best, best_obj = (math.log(max(E, 1e-6)), math.log(max(A, 1e-12)), float(alpha)), obj
    return best


def _fit_once(x: np.ndarray, L: np.ndarray, huber_delta: float, extra_inits: Sequence[tuple] = (),
              max_nfev: int = 200) -> Optional[np.ndarray]:
    """Best (log E, log A_ref, alpha): the profile start and any extra starts, each polished by
    bounded least squares with a Huber loss on log L. None if every start fails."""
    log_L = np.log(L)
    lo = [math.log(1e-6), -30.0, 0.0]
    hi = [math.log(float(L.max())), 30.0, 5.0]
    start = np.asarray(_profile_start(x, L, huber_delta))
    best, best_cost = start, _huber(_residuals(start, x, log_L), huber_delta)
    for theta0 in [start, *extra_inits]:
        theta0 = np.clip(np.asarray(theta0, dtype=float), np.add(lo, 1e-9), np.subtract(hi, 1e-9))
        try:
            res = least_squares(_residuals, theta0, jac=_jacobian, args=(x, log_L), loss="huber",
                                f_scale=huber_delta, bounds=(lo, hi), method="trf", max_nfev=max_nfev)
        except (ValueError, FloatingPointError):
            continue
        cost = _huber(_residuals(res.x, x, log_L), huber_delta)
        # status 0 = evaluation budget spent: along the flat E-A valley that is still a usable fit
        if res.status >= 0 and np.isfinite(cost) and cost < best_cost:
            best, best_cost = res.x, cost
    return best if np.all(np.isfinite(best)) else None


def _init_grid(L: np.ndarray) -> list[tuple]:
    """Extra starting points: E a fraction of the lowest loss, alpha from shallow to steep."""
    inits = []
    for e_frac in (0.2, 0.6, 0.9):
        E0 = e_frac * float(L.min())
        A0 = max(float(np.mean(L)) - E0, 1e-3)
        for alpha0 in (0.05, 0.2, 0.5, 1.0):
            inits.append((math.log(E0), math.log(A0), alpha0))
    return inits


def fit_power_law(C: Sequence[float], L: Sequence[float], *, n_boot: int = 200, huber_delta: float = 1e-3,
                  seed: int = 0) -> PowerLawFit:
    """Fit L(C) = E + A * C^(-alpha) robustly on log L; bootstrap the points for 95% intervals.

    C: training FLOPs of each point (> 0); L: its loss (> 0). Points are (C, L) pairs; the
    bootstrap resamples pairs with replacement and skips resamples with fewer than
    ``MIN_POINTS`` distinct C values (they cannot determine three parameters).
    """
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    n = len(C)
    if len(L) != n:
        raise ValueError(f"fit_power_law: {n} compute values but {len(L)} losses")
    if n and (np.any(~np.isfinite(C)) or np.any(C <= 0) or np.any(~np.isfinite(L)) or np.any(L <= 0)):
        raise ValueError("fit_power_law: compute and loss must be finite and positive "
                         "(drop failed or diverged runs before fitting)")
    n_distinct = len(np.unique(C))
    if n_distinct < MIN_POINTS:
        return PowerLawFit(n_points=n, status="under-determined",
                           message=f"{n_distinct} distinct compute values; 3 parameters need >= {MIN_POINTS}")
    c_ref = float(np.exp(np.mean(np.log(C))))
    x = C / c_ref
    theta = _fit_once(x, L, huber_delta, _init_grid(L)[::3], max_nfev=500)
    if theta is None:
        return PowerLawFit(n_points=n, status="failed", message="least squares did not converge from any start")
    fit = _to_fit(theta, n, c_ref)
    fit.rms_log_residual = float(np.sqrt(np.mean(_residuals(theta, x, np.log(L)) ** 2)))
    _bootstrap(fit, theta, x, L, n_boot, huber_delta, seed)
    return fit


def _to_fit(theta: np.ndarray, n: int, c_ref: float) -> PowerLawFit:
    log_E, log_A_ref, alpha = (float(v) for v in theta)
    A_ref = math.exp(log_A_ref)
    return PowerLawFit(n_points=n, status="ok", E=math.exp(log_E), alpha=alpha, c_ref=c_ref, A_ref=A_ref,
                       A=A_ref * c_ref ** alpha)


def _bootstrap(fit: PowerLawFit, theta: np.ndarray, x: np.ndarray, L: np.ndarray, n_boot: int,
               huber_delta: float, seed: int) -> None:
    """Fill ``fit.ci`` with 95% percentile intervals of E, A_ref and alpha.

    With at least ``PAIRS_MIN_POINTS`` distinct compute values the points themselves are
    resampled. With fewer, almost every resample that still has four distinct points is the
    original set again, so those intervals would be falsely narrow; the residuals (on log L,
    inflated by sqrt(n / (n - 3)) for the three fitted parameters) are resampled instead.
    """
    rng = np.random.default_rng(seed)
    n = len(x)
    log_fit = np.log(fit.E + fit.A_ref * x ** (-fit.alpha))
    resid = np.log(L) - log_fit
    resid = (resid - resid.mean()) * math.sqrt(n / max(n - 3, 1))
    pairs = len(np.unique(x)) >= PAIRS_MIN_POINTS
    fit.ci_method = "points" if pairs else "residuals"
    inits = [tuple(theta)]  # the full fit is a good start for a resample (next to its own profile start)
    samples = []
    for _ in range(n_boot):
        if pairs:
            idx = rng.integers(0, n, n)
            if len(np.unique(x[idx])) < MIN_POINTS:
                continue
            xb, Lb = x[idx], L[idx]
        else:
            xb, Lb = x, np.exp(log_fit + resid[rng.integers(0, n, n)])
        t = _fit_once(xb, Lb, huber_delta, inits, max_nfev=100)
        if t is not None:
            samples.append((math.exp(t[0]), math.exp(t[1]), t[2]))
    fit.n_boot = len(samples)
    if len(samples) >= 10:
        s = np.asarray(samples)
        fit.samples = s
        for j, name in enumerate(("E", "A_ref", "alpha")):
            fit.ci[name] = [float(np.percentile(s[:, j], 2.5)), float(np.percentile(s[:, j], 97.5))]


def pareto_frontier(C: Sequence[float], L: Sequence[float]) -> np.ndarray:
    """Indices of the compute-optimal points: no other point reaches a lower loss with at most
    the same compute. Returned in increasing C."""
    C = np.asarray(C, dtype=float)
    L = np.asarray(L, dtype=float)
    order = np.lexsort((L, C))
    keep, best = [], math.inf
    for i in order:
        if L[i] < best:
            keep.append(i)
            best = L[i]
    return np.asarray(keep, dtype=int)


# --------------------------------------------------------------------------------------------
# points from runs
# --------------------------------------------------------------------------------------------


@dataclass
class Point:
    """One finished run as a point of its family's scaling curve."""

    run: str
    family: str
    is_moe: bool
    flops: float  # training FLOPs spent: tokens seen x training FLOPs per token
    loss: float  # final validation loss (nats/token) at the training context length
    tokens: float
    params_total: int
    params_active: int
    flops_per_token: float


def collect(runs) -> tuple[list[Point], list[dict], dict[str, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]]]:
    """(points of finished runs, excluded runs with reasons, validation curves per family).

    Curves: family -> [(run, tokens_T, flops_T, loss_T)] from each usable run's validation rows.
    """
    points, excluded, curves = [], [], {}
    for r in runs:
        if r.status != "finished":
            excluded.append({"run": str(r.path), "status": r.status, "reason": r.reason})
            continue
        tokens = r.tokens_seen
        points.append(Point(run=r.name, family=r.family, is_moe=r.is_moe, flops=r.training_flops(tokens),
                            loss=float(r.final_val_loss), tokens=tokens, params_total=r.params["total"],
                            params_active=r.params["active"], flops_per_token=r.flops_per_token))
        rows = [v for v in r.val_rows if v.get("tokens") and math.isfinite(v["loss"])]
        if rows:
            t = np.array([v["tokens"] for v in rows], dtype=float)
            curves.setdefault(r.family, []).append((r.name, t, t * r.flops_per_token,
                                                    np.array([v["loss"] for v in rows], dtype=float)))
    return points, excluded, curves


def envelope(curves: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]],
             n: int = 60) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Compute-optimal frontier of a family: at each compute C, the lowest validation loss any
    run reached with at most C FLOPs (Kaplan's envelope). Returns (C grid, loss, run at each C)."""
    all_c = np.concatenate([c for _, _, c, _ in curves])
    grid = np.logspace(np.log10(all_c.min()), np.log10(all_c.max()), n)
    best = np.full(n, np.inf)
    who = [""] * n
    for name, _, c, loss in curves:
        for j, g in enumerate(grid):
            reached = loss[c <= g * (1 + 1e-9)]
            if len(reached) and reached.min() < best[j]:
                best[j], who[j] = reached.min(), name
    ok = np.isfinite(best)
    return grid[ok], best[ok], [w for w, k in zip(who, ok) if k]


def fit_families(points: list[Point], n_boot: int, huber_delta: float, seed: int) -> dict[str, PowerLawFit]:
    fits = {}
    for fam in sorted({p.family for p in points}):
        ps = [p for p in points if p.family == fam]
        fits[fam] = fit_power_law([p.flops for p in ps], [p.loss for p in ps], n_boot=n_boot,
                                  huber_delta=huber_delta, seed=seed)
    return fits


def compare_dense_moe(points: list[Point], fits: dict[str, PowerLawFit]) -> list[dict]:
    """For every MoE point: each dense family's loss at the same training FLOPs (from its fit,
    within the fitted range) and at the same active parameters (interpolated in log N between
    that family's runs with the same token count, within their range). "Within" allows
    ``RANGE_SLACK`` (5%) beyond the ends: an MoE built to match a dense size sits just past it."""
    out = []
    dense_fams = sorted({p.family for p in points if not p.is_moe})
    for m in (p for p in points if p.is_moe):
        row = {"run": m.run, "family": m.family, "flops": m.flops, "params_active": m.params_active,
               "loss": m.loss, "dense_families": dense_fams, "equal_flops": {}, "equal_active_params": {}}
        for fam in dense_fams:
            ds = [p for p in points if p.family == fam]
            f = fits.get(fam)
            lo, hi = min(p.flops for p in ds), max(p.flops for p in ds)
            if f is not None and f.status == "ok" and lo / RANGE_SLACK <= m.flops <= hi * RANGE_SLACK:
                L = float(f.predict(m.flops))
                row["equal_flops"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
            same_t = sorted((p for p in ds if abs(p.tokens - m.tokens) <= 0.05 * m.tokens),
                            key=lambda p: p.params_active)
            if (len(same_t) >= 2 and same_t[0].params_active / RANGE_SLACK <= m.params_active
                    <= same_t[-1].params_active * RANGE_SLACK):  # np.interp holds the end values
                L = float(np.interp(np.log(m.params_active), [np.log(p.params_active) for p in same_t],
                                    [p.loss for p in same_t]))
                row["equal_active_params"][fam] = {"loss": L, "moe_minus_dense": m.loss - L}
        out.append(row)
    return out


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------


def _ci(fit: PowerLawFit, name: str, fmt: str) -> str:
    lo_hi = fit.ci.get(name)
    return f" [{format(lo_hi[0], fmt)}, {format(lo_hi[1], fmt)}]" if lo_hi else ""


def fits_table(fits: dict[str, PowerLawFit]) -> str:
    """Markdown table of the fitted parameters with 95% bootstrap intervals."""
    lines = ["| family | points | E (nats) [95% CI] | alpha [95% CI] | A_ref at c_ref [95% CI] | c_ref (FLOPs) "
             "| A (C in FLOPs) | rms log residual | status |",
             "|---|---|---|---|---|---|---|---|---|"]
    for fam, f in fits.items():
        if f.status != "ok":
            lines.append(f"| {fam} | {f.n_points} | - | - | - | - | - | - | {f.status}: {f.message} |")
            continue
        lines.append(f"| {fam} | {f.n_points} | {f.E:.3f}{_ci(f, 'E', '.3f')} | "
                     f"{f.alpha:.3f}{_ci(f, 'alpha', '.3f')} | "
                     f"{f.A_ref:.3f}{_ci(f, 'A_ref', '.3f')} | {f.c_ref:.3g} | {f.A:.4g} | {f.rms_log_residual:.4f} | "
                     f"ok ({f.n_boot} bootstrap fits over {f.ci_method or '-'}) |")
    return "\n".join(lines)


def points_table(points: list[Point]) -> str:
    lines = ["| run | family | params (total / active) | tokens | training FLOPs | final val loss |",
             "|---|---|---|---|---|---|"]
    for p in sorted(points, key=lambda p: (p.family, p.flops)):
        lines.append(f"| {p.run} | {p.family} | {p.params_total:,} / {p.params_active:,} | {p.tokens:.3g} | "
                     f"{p.flops:.3g} | {p.loss:.4f} |")
    return "\n".join(lines)


def comparison_table(rows: list[dict]) -> str:
    if not rows:
        return "(no MoE runs: no dense-vs-MoE comparison)"
    lines = ["| MoE run | loss | dense family | dense loss at equal FLOPs (MoE - dense) "
             "| dense loss at equal active params (MoE - dense) |",
             "|---|---|---|---|---|"]

    def cell(d):
        return f"{d['loss']:.4f} ({d['moe_minus_dense']:+.4f})" if d else "out of range"

    for r in rows:
        fams = r["dense_families"] or ["-"]
        for fam in fams:
            ef, ea = r["equal_flops"].get(fam), r["equal_active_params"].get(fam)
            lines.append(f"| {r['run']} | {r['loss']:.4f} | {fam} | {cell(ef)} | {cell(ea)} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# plots
# --------------------------------------------------------------------------------------------


def _plain_log_y(ax) -> None:
    """Log-scaled y axis labelled with plain numbers (6.8, 7.0...) instead of 7x10^0."""
    from matplotlib.ticker import LogLocator, ScalarFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=np.arange(1, 10) / 10 * 10, numticks=12))
    for fmt in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        f = ScalarFormatter()
        f.set_scientific(False)
        fmt(f)


def _colors(families: list[str]) -> dict[str, str]:
    return {f: f"C{i % 10}" for i, f in enumerate(sorted(families))}


def _marker(is_moe: bool) -> str:
    return "s" if is_moe else "o"


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
        ax.scatter(C, L, color=col[fam], marker=_marker(ps[0].is_moe), zorder=3, label=label)
        if f is not None and f.status == "ok":
            grid = np.logspace(np.log10(C.min()) - 0.15, np.log10(C.max()) + 0.15, 100)
            ax.plot(grid, f.predict(grid), color=col[fam], lw=1.5,
                    label=f"{fam} fit: {f.E:.2f} + A·C^-{f.alpha:.2f}")
            band = f.band(grid)
            if band is not None:
                ax.fill_between(grid, band[0], band[1], color=col[fam], alpha=0.15, lw=0)
    all_L = [p.loss for p in points]
    ax.set_xscale("log")
    _plain_log_y(ax)
    ax.set_ylim(0.97 * min(all_L), 1.05 * max(all_L))  # the band may blow up when extrapolating
    style_axes(ax, "Final validation loss vs training compute\n(lines: L(C) = E + A·C^-alpha, band: 95% bootstrap)",
               "training compute C (FLOPs)", "validation loss (nats/token)")
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


def plot_loss_vs_tokens(runs_by_family: dict[str, list], path: Path) -> Path:
    """One panel per family: validation loss against tokens seen, one line per run (by size)."""
    plt = pyplot()
    fams = sorted(runs_by_family)
    fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 4.2), squeeze=False, sharey=True)
    for ax, fam in zip(axes[0], fams):
        runs = sorted(runs_by_family[fam], key=lambda r: r.params["active"])
        cmap = plt.get_cmap("viridis")
        for i, r in enumerate(runs):
            rows = [v for v in r.val_rows if v.get("tokens")]
            if not rows:
                continue
            color = cmap(i / max(1, len(runs) - 1) * 0.9)
            ax.plot([v["tokens"] for v in rows], [v["loss"] for v in rows], "o-", ms=3, color=color,
                    label=f"{r.name} ({r.params['active'] / 1e6:.2f}M active)")
        ax.set_xscale("log")
        style_axes(ax, f"{fam}: validation loss vs tokens", "tokens seen", "validation loss (nats/token)")
    fig.tight_layout()
    return save_figure(fig, path)


def plot_dense_vs_moe(points, fits, path: Path) -> Path:
    """Left: loss against training FLOPs (equal compute). Right: loss against active parameters
    per token (equal active size), lines joining runs of one family with the same token count."""
    plt = pyplot()
    fams = sorted({p.family for p in points})
    col = _colors(fams)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5))
    for fam in fams:
        ps = sorted((p for p in points if p.family == fam), key=lambda p: p.flops)
        moe = ps[0].is_moe
        kind = "MoE" if moe else "dense"
        ax.scatter([p.flops for p in ps], [p.loss for p in ps], color=col[fam], marker=_marker(moe), zorder=3,
                   label=f"{fam} ({kind})")
        f = fits.get(fam)
        if f is not None and f.status == "ok":
            grid = np.logspace(np.log10(ps[0].flops), np.log10(ps[-1].flops), 60)
            ax.plot(grid, f.predict(grid), color=col[fam], ls="--" if moe else "-", lw=1.3)
        for tokens in sorted({round(p.tokens, -3) for p in ps}):
            same = sorted((p for p in ps if round(p.tokens, -3) == tokens), key=lambda p: p.params_active)
            bx.plot([p.params_active for p in same], [p.loss for p in same], color=col[fam],
                    marker=_marker(moe), ls="--" if moe else "-",
                    label=f"{fam} ({kind}), {tokens:.3g} tokens")
    for a in (ax, bx):
        a.set_xscale("log")
    style_axes(ax, "Dense vs MoE at equal training compute\n(lines: fitted L(C), dashed for MoE)",
               "training compute C (FLOPs)", "final validation loss (nats/token)")
    style_axes(bx, "Dense vs MoE at equal active parameters\n(MoE: K routed + shared experts + router)",
               "active parameters per token (count, embeddings included)", "final validation loss (nats/token)")
    fig.tight_layout()
    return save_figure(fig, path)


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def analyse(inputs: Sequence[str], out: Optional[Path], n_boot: int = 200, huber_delta: float = 1e-3,
            seed: int = 0) -> dict:
    """Read the runs, fit each family, write the plots and tables to ``out``; return the results."""
    runs, problems = expand_inputs(inputs)
    points, excluded, curves = collect(runs)
    excluded = [{"run": p, "status": "unreadable", "reason": why} for p, why in problems] + excluded
    if not points:
        raise RunError("no finished run among the inputs: " +
                       "; ".join(f"{e['run']}: {e['reason']}" for e in excluded))
    fits = fit_families(points, n_boot, huber_delta, seed)
    comparisons = compare_dense_moe(points, fits)
    result = {
        "model": "L(C) = E + A * C^(-alpha); C = training FLOPs, L = final validation loss (nats/token)",
        "fit": {"loss": "huber on log L", "huber_delta": huber_delta, "bootstrap_resamples": n_boot,
                "interval": "95% percentile bootstrap: over points (>= 6 points) else over log-L residuals",
                "seed": seed},
        "families": {fam: {**f.to_json(), "points": [asdict(p) for p in points if p.family == fam]}
                     for fam, f in fits.items()},
        "excluded": excluded,
        "dense_vs_moe": comparisons,
    }
    text = "\n\n".join([
        "## Fitted L(C) = E + A * C^(-alpha) per family", fits_table(fits),
        "## Points (finished runs)", points_table(points),
        "## Dense vs MoE", comparison_table(comparisons),
        "## Excluded runs", "\n".join(f"- {e['run']}: {e['status']} ({e['reason']})" for e in excluded) or "(none)",
    ])
    result["table_markdown"] = text
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "fits.json", result)
        write_text_atomic(out / "fits.md", text + "\n")
        by_family: dict[str, list] = {}
        for r in runs:
            if r.status == "finished":
                by_family.setdefault(r.family, []).append(r)
        plot_loss_vs_flops(points, fits, curves, out / "loss_vs_flops.png")
        plot_loss_vs_tokens(by_family, out / "loss_vs_tokens.png")
        plot_dense_vs_moe(points, fits, out / "dense_vs_moe.png")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.scaling", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="+", help="run folders, globs (quote them), sweep folders or folders of runs")
    ap.add_argument("--out", type=Path, help="folder for the plots, fits.json and fits.md (default: print only)")
    ap.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for the intervals (default 200)")
    ap.add_argument("--huber-delta", type=float, default=1e-3,
                    help="Huber loss threshold on log L residuals (default 1e-3, as Chinchilla)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    args = ap.parse_args(argv)
    try:
        if args.bootstrap < 0:
            raise ValueError(f"--bootstrap {args.bootstrap}: must be >= 0")
        if not args.huber_delta > 0:
            raise ValueError(f"--huber-delta {args.huber_delta}: must be positive")
        result = analyse(args.inputs, args.out, args.bootstrap, args.huber_delta, args.seed)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(result["table_markdown"])
    if args.out is not None:
        print(f"\nwrote {args.out}/loss_vs_flops.png, loss_vs_tokens.png, dense_vs_moe.png, fits.json, fits.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
