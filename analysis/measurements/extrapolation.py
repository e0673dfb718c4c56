"""``extrapolation: {multipliers, tokens, arms, variants}``: every finished run of the listed arms
(``arms``, default all) evaluated at each multiple of its training context L (``multipliers``,
default [1, 2, 4, 8]) on ``tokens`` validation tokens per length (default 32768)
(:func:`evaluate_lengths`), once as trained and once per evaluation-time variant of its arm
(``variants: {name: {arm, label, set}}``, e.g. RoPE + YaRN: overrides of the model config at
evaluation only, ``{factor}`` = length / L, ``{L}`` = the training context); each evaluation cached
under ``<out>/measurements/extrapolation/``. The report: the loss at each length with its interval,
the paired growth from L to the longest length, and the loss per token position.

The evaluation of one trained run: validation loss at multiples of the training context,
overall and per token position, optionally with evaluation-time overrides of the model config
(RoPE position interpolation, NTK-aware or YaRN scaling: ``model.position.rope_scaling.*``).

    from analysis.measurements.extrapolation import evaluate_lengths
    evaluate_lengths("runs/rope-seed0", multipliers=[1, 2, 4, 8], tokens=32768,
                     overrides=["model.position.rope_scaling.type=yarn",
                                "model.position.rope_scaling.factor={factor}",
                                "model.position.rope_scaling.original_max_seq_len={L}"])

``{factor}`` in an override becomes the multiplier of the length evaluated (the context
extension factor s = length / L) and ``{L}`` the training context length. At every length the
same number of validation tokens is scored (``tokens``, in windows of the evaluated length evenly
strided over the validation split: the same windows for every run of one corpus). A learned
position table cannot encode positions past ``model.max_seq_len``: such lengths are reported as
not applicable, with the reason, never clamped or wrapped.

Shape legend: B windows, S positions per window, V vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from analysis.experiment_spec import Spec
from analysis.experiments import Context, Section, figure_md, fmt_ci, mean_unigram, paired_difference, t_interval, table
from analysis.measurements.base import (
    Measurement,
    cached,
    check_int,
    check_ints,
    check_names,
    measurement_folder,
    record_arms,
    register,
)
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from archlab.config import load_recipe
from archlab.data import eval_windows
from archlab.errors import RecipeError
from archlab.model.build import build_model
from archlab.nn.positions import position_class
from archlab.objectives import token_data
from archlab.objectives.causal_lm import CausalLM
from archlab.train.checkpoint import load_weights_into, resolve_checkpoint


def eval_overrides(overrides: Sequence[str], multiplier: int, train_len: int) -> list[str]:
    """Fill ``{factor}`` (the multiplier) and ``{L}`` (the training context) into each override."""
    return [o.replace("{factor}", f"{float(multiplier):g}").replace("{L}", str(train_len)) for o in overrides]


@torch.no_grad()
def loss_per_position(model, windows, S: int) -> tuple[torch.Tensor, int]:
    """Summed next-token loss per position (S,) over the windows, and the number of windows."""
    sums_S = torch.zeros(S, dtype=torch.float64)
    n = 0
    for x_BS1 in windows:
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        logits_BSV = model(inputs_BS).logits
        loss_BS = F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten(), reduction="none")
        sums_S += loss_BS.view(x_BS1.shape[0], S).sum(0).double()
        n += x_BS1.shape[0]
    return sums_S, n


def evaluate_lengths(run_dir: str | Path, multipliers: Sequence[int], tokens: int = 32768,
                     overrides: Sequence[str] = (), bin_width: Optional[int] = None,
                     batch_tokens: int = 8192) -> dict:
    """Validation loss of the run's newest checkpoint at each ``multiplier * L`` (L = train.seq_len).

    Returns {"train_len", "overrides", "lengths": [{multiplier, context_len, loss, windows,
    per_position: {bin_width, loss}} or {multiplier, context_len, status: "n/a", reason}]}. The
    per-position curve is the mean loss over windows at each position, averaged in bins of
    ``bin_width`` positions (default L / 8).
    """
    ckpt = resolve_checkpoint(run_dir)
    base = load_recipe(ckpt / "recipe.yaml")
    L = int(base.train.seq_len)
    data = token_data(base)
    width = bin_width or max(1, L // 8)
    out = {"train_len": L, "overrides": list(overrides), "checkpoint": str(ckpt), "lengths": []}
    for m in multipliers:
        S = int(m) * L
        row = {"multiplier": int(m), "context_len": S}
        cfg = load_recipe(ckpt / "recipe.yaml", eval_overrides(overrides, m, L))
        limit = position_class(cfg.model).max_length(cfg.model)  # the encoding says how far it reaches
        if limit is not None and S > limit:
            out["lengths"].append({**row, "status": "n/a", "reason": f"{cfg.model.position.type} positions end at "
                                   f"model.max_seq_len={cfg.model.max_seq_len}"})
            continue
        model = build_model(cfg)
        load_weights_into(model, ckpt)
        model.eval()
        n_windows = max(1, tokens // S)
        batch = max(1, min(n_windows, batch_tokens // S))
        windows = eval_windows(data.val, S, batch, -(-n_windows // batch))
        sums_S, n = loss_per_position(model, windows, S)
        per_pos = (sums_S / n).tolist()
        bins = [sum(per_pos[i:i + width]) / len(per_pos[i:i + width]) for i in range(0, S, width)]
        out["lengths"].append({**row, "status": "ok", "loss": float(sums_S.sum() / (n * S)), "windows": n,
                               "per_position": {"bin_width": width, "loss": bins}})
    return out


VARIANT_KEYS = ("arm", "label", "set")


@register
class Extrapolation(Measurement):
    """Loss at L, 2L, 4L, 8L (and per position), as trained and with evaluation-time variants."""

    name = "extrapolation"
    title = "Length extrapolation"
    keys = ("arms", "multipliers", "tokens", "variants")

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_names(s, "arms", where)
        check_ints(s, "multipliers", where)
        check_int(s, "tokens", where)
        variants = s.get("variants")
        if "variants" in s and not isinstance(variants, dict):
            raise RecipeError(f"{where}.variants={variants!r}: expected a mapping of variant name -> "
                              "{arm, label, set}")
        for name, v in (variants or {}).items():
            w = f"{where}.variants.{name}"
            if not isinstance(v, dict) or not v.get("arm"):
                raise RecipeError(f"{w}={v!r}: expected a mapping with 'arm:' (and 'label:', 'set:')")
            unknown = sorted(set(v) - set(VARIANT_KEYS))
            if unknown:
                raise RecipeError(f"{w}: unknown keys {unknown}; valid: {', '.join(VARIANT_KEYS)}")
            if not isinstance(v.get("set", []), list):
                raise RecipeError(f"{w}.set={v['set']!r}: expected a list of KEY=VALUE overrides")
        return s

    loads_checkpoints = True

    def _scored(self, record: dict) -> list[tuple[dict, dict, Path]]:
        """(job, run, cache file) of every evaluation: each job on its arm's finished runs."""
        folder = measurement_folder(record) / self.name
        return [(job, run, folder / f"{run['point']}--{job['variant']}.json") for job in extrapolation_jobs(record)
                for run in record["runs"] if run["arm"] == job["arm"] and _finished(run)]

    def checkpoints(self, record: dict) -> dict[str, Path]:
        out: dict[str, Path] = {}
        for _, run, path in self._scored(record):  # a run evaluated under several variants: any missing one
            if run["run_dir"] not in out or not path.is_file():
                out[run["run_dir"]] = path
        return out

    def run(self, record: dict, log=print) -> list[dict]:
        m = self.settings(record)
        multipliers = [int(x) for x in m.get("multipliers", [1, 2, 4, 8])]
        tokens = int(m.get("tokens", 32768))
        out = []
        for job, run, path in self._scored(record):
            settings = {"multipliers": multipliers, "tokens": tokens, "overrides": job["overrides"],
                        "run_dir": run["run_dir"]}
            if not path.is_file():
                log(f"extrapolation: {job['variant']} on {run['point']}")
            result = cached(path, settings, lambda: evaluate_lengths(run["run_dir"], multipliers, tokens,
                                                                      job["overrides"]))
            out.append({**job, "seed": run["seed"], "cell": run["cell"], "point": run["point"], "result": result})
        return out

    def section(self, ctx: Context) -> Section:
        rows_data, multipliers = _extrapolation_table(ctx)
        if not rows_data:
            return Section(self.title, "(no evaluations: no finished runs of the listed arms)")
        L = rows_data[0]["train_len"]
        header = ["position encoding", *[f"{m}L = {m * L}" for m in multipliers],
                  f"loss({multipliers[-1]}L) - loss(L), paired"]
        rows = []
        for v in rows_data:
            cells = []
            for m in multipliers:
                cells.append(f"n/a ({v['not_applicable'][m]})" if m in v["not_applicable"]
                             else fmt_ci(v["per_multiplier"][m]["loss"]))
            g = v["growth"]
            growth = "-"
            if g:
                growth = fmt_ci(g, signed=True) + (f" (to {g['to']}L)" if g["to"] != multipliers[-1] else "")
            rows.append([v["label"], *cells, growth])
        md = (f"Validation loss (nats/token, mean [95% CI] over seeds) at multiples of the training context L = {L}, "
              f"{int((ctx.spec.wanted['extrapolation'] or {}).get('tokens', 32768))} validation tokens per "
              "length (the same windows for every run). Variants with `+` apply a RoPE scaling at evaluation only, "
              "with factor s = length / L (at L: s = 1, the unscaled model).\n\n" + table(header, rows))
        figures = []
        for fig in (plot_extrapolation(ctx, rows_data, multipliers, ctx.out / "extrapolation.png"),
                    plot_per_position(ctx, rows_data, max(multipliers), ctx.out / "per_position.png")):
            md += figure_md(figures, fig, fig.stem if fig else "")  # alt text: the file's stem
        return Section(self.title, md, figures, {"variants": rows_data, "multipliers": multipliers})


def _finished(run: dict) -> bool:
    path = Path(run["run_dir"]) / "summary.json"
    try:
        return json.loads(path.read_text()).get("status") == "completed"
    except (OSError, ValueError):
        return False


def extrapolation_jobs(record: dict) -> list[dict]:
    """(arm, variant, overrides) of every evaluation: each listed arm as trained, then the variants."""
    m = Spec.from_dict(record["spec"]).wanted["extrapolation"] or {}
    labels = {a.name: a.label for a in record_arms(record)}
    arm_names = list(labels)
    listed = m.get("arms") or arm_names
    jobs = [{"arm": a, "variant": a, "label": labels[a],
             "overrides": []} for a in listed]
    for name, v in (m.get("variants") or {}).items():
        if v.get("arm") not in arm_names:
            raise ValueError(f"measurements.extrapolation.variants.{name}.arm={v.get('arm')!r}: not an arm "
                             f"(arms: {', '.join(arm_names)})")
        jobs.append({"arm": v["arm"], "variant": name, "label": v.get("label", name),
                     "overrides": list(v.get("set", []))})
    return jobs


def _extrapolation_table(ctx: Context) -> tuple[list[dict], list[int]]:
    """Per variant: per multiplier the loss interval over seeds (or n/a), and the paired growth
    from L to the longest length."""
    results = ctx.measures.get("extrapolation") or []
    variants: dict[str, dict] = {}
    for r in results:
        v = variants.setdefault(r["variant"], {"variant": r["variant"], "arm": r["arm"], "label": r["label"],
                                               "by_seed": {}})
        v["by_seed"][r["seed"]] = r["result"]
    multipliers = sorted({row["multiplier"] for r in results for row in r["result"]["lengths"]})
    out = []
    for v in variants.values():
        per_m, na, curves = {}, {}, {}
        for m in multipliers:
            vals, reasons = {}, set()
            for seed, res in v["by_seed"].items():
                row = next((x for x in res["lengths"] if x["multiplier"] == m), None)
                if row is None:
                    continue
                if row["status"] == "ok":
                    vals[seed] = row["loss"]
                    curves.setdefault(m, []).append(row["per_position"])
                else:
                    reasons.add(row["reason"])
            per_m[m] = {"loss": t_interval(list(vals.values())), "by_seed": vals}
            if reasons and not vals:
                na[m] = "; ".join(sorted(reasons))
        ok = [m for m in multipliers if m not in na and per_m[m]["loss"]["n"]]
        growth = None
        if len(ok) > 1:
            growth = paired_difference(per_m[ok[-1]]["by_seed"], per_m[ok[0]]["by_seed"])
            growth["from"], growth["to"] = ok[0], ok[-1]
        out.append({**{k: v[k] for k in ("variant", "arm", "label")}, "per_multiplier": per_m, "not_applicable": na,
                    "growth": growth, "train_len": next(iter(v["by_seed"].values()))["train_len"],
                    "per_position": {m: _mean_curve(c) for m, c in curves.items()}})
    return out, multipliers


def _mean_curve(curves: list[dict]) -> dict:
    width = curves[0]["bin_width"]
    arr = np.array([c["loss"] for c in curves], dtype=float)
    return {"bin_width": width, "loss": arr.mean(axis=0).tolist(), "n": len(curves)}


def _growth_curve(v: dict, ms: list[int]) -> list[dict]:
    """At each multiplier m of ``ms``: the t-interval over seeds of loss(m L) - loss(L), paired by seed."""
    base = v["per_multiplier"][ms[0]]["by_seed"]
    return [paired_difference(v["per_multiplier"][m]["by_seed"], base) for m in ms]


def plot_extrapolation(ctx: Context, rows_data: list[dict], multipliers: list[int], path):
    """Left: the loss at each evaluated length, the trained encodings with their intervals over seeds
    (the evaluation-time variants dashed, their intervals on the right). Right: the paired increase
    over the loss at L with its 95% interval, every curve at its own small offset along x so that the
    intervals do not hide each other, zoomed so that one encoding that blows up does not flatten the
    others."""
    plt = pyplot()
    fig, (ax, ax_g) = plt.subplots(1, 2, figsize=(14, 5.4))
    L = rows_data[0]["train_len"]
    at_L, growth = [], {}
    shown: list[float] = []
    for i, v in enumerate(rows_data):
        ms = [m for m in multipliers if m not in v["not_applicable"] and v["per_multiplier"][m]["loss"]["n"]]
        if not ms:
            continue
        means = [v["per_multiplier"][m]["loss"]["mean"] for m in ms]
        low = [v["per_multiplier"][m]["loss"]["low"] for m in ms]
        high = [v["per_multiplier"][m]["loss"]["high"] for m in ms]
        variant = v["variant"] != v["arm"]
        color = COLORS[i % len(COLORS)]
        ax.plot([m * L for m in ms], means, "--" if variant else "-", marker="o", ms=4, color=color,
                label=v["label"] + (f" (n/a past {ms[-1] * L})" if v["not_applicable"] else ""))
        if not variant and all(x is not None for x in low):
            ax.fill_between([m * L for m in ms], low, high, color=color, alpha=0.15, lw=0)
        at_L.append(means[0])
        shown += means
        if len(ms) > 1:
            growth[v["label"]] = (ms, _growth_curve(v, ms), "--" if variant else "-", color)
    for a in (ax, ax_g):
        a.axvline(L, color="0.3", ls="--", lw=0.8, label=f"training context L = {L}")
        a.set_xscale("log", base=2)
        a.set_xticks([m * L for m in multipliers], [f"{m * L}" for m in multipliers])
        a.minorticks_off()
    if at_L:  # the trained-length losses stay readable when a variant blows up at long contexts
        top = min(max(shown), max(at_L) + 0.8)
        ax.set_ylim(min(shown) - 0.05 * (top - min(shown)) - 0.02, top + 0.05 * (top - min(shown)) + 0.02)
    unigram = mean_unigram(ctx)
    if unigram and at_L and unigram < ax.get_ylim()[1]:  # the unigram line only inside the data's range
        ax.axhline(unigram, color="0.5", ls=":", lw=1, label="unigram entropy")
    style_axes(ax, "Validation loss against evaluation context\n(shaded: 95% CI over seeds of the trained encodings)",
               "evaluation context length (tokens, log scale)", "validation loss (nats/token)", legend=False)
    peaks = sorted(max(abs(g["high"] if g.get("high") is not None else g["mean"]) for g in c[1])
                   for c in growth.values())
    clip = peaks[-2] * 1.3 + 0.02 if len(peaks) > 1 and peaks[-1] > 2.5 * peaks[-2] else None
    ax_g.axhline(0.0, color="0.3", lw=0.8)
    n = len(growth)
    for j, (label, (ms, g, style, color)) in enumerate(growth.items()):
        shift = 2 ** (0.12 * (j - (n - 1) / 2))  # a small offset along the log axis per curve
        x = [m * L * shift for m in ms]
        y = [d["mean"] for d in g]
        err = None
        if all(d.get("low") is not None for d in g):
            err = [[d["mean"] - d["low"] for d in g], [d["high"] - d["mean"] for d in g]]
        off = clip is not None and max(abs(v) for v in y) > clip
        ax_g.errorbar(x, y, yerr=err, fmt=style, marker="o", ms=4, capsize=2, lw=1.2, color=color,
                      label=label + (" (off scale)" if off else ""))
    if clip is not None:
        ax_g.set_ylim(-0.25 * clip, clip)
    style_axes(ax_g, "Increase over the loss at L\n(same-seed differences: mean and 95% CI; curves offset along x)",
               "evaluation context length (tokens, log scale)", "loss(length) - loss(L) (nats/token)",
               legend=False)
    handles, labels = ax_g.get_legend_handles_labels()
    for h, label in zip(*ax.get_legend_handles_labels()):  # one legend for both panels
        if not any(x.split(" (")[0] == label.split(" (")[0] for x in labels):
            handles.append(h)
            labels.append(label)
    ax_g.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, path)


def plot_per_position(ctx: Context, rows_data: list[dict], multiplier: int, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    L = rows_data[0]["train_len"]
    drawn = 0
    firsts, lasts = [], []
    for i, v in enumerate(rows_data):
        curve = v["per_position"].get(multiplier)
        if curve is None:
            continue
        w = curve["bin_width"]
        x = [w * (j + 0.5) for j in range(len(curve["loss"]))]
        ax.plot(x, curve["loss"], "--" if v["variant"] != v["arm"] else "-", color=COLORS[i % len(COLORS)],
                label=v["label"], lw=1.3)
        firsts.append(min(curve["loss"]))
        lasts.append(max(curve["loss"][min(2, len(curve["loss"]) - 1):]))
        drawn += 1
    if not drawn:
        return None
    ax.axvline(L, color="0.3", ls="--", lw=0.8, label=f"training context L = {L}")
    # the range of the curves past their first bins (the first positions, with almost no context, sit near
    # the unigram loss for every encoding); the unigram line only when it falls inside that range
    lo, hi = min(firsts), max(lasts)
    ax.set_ylim(lo - 0.08 * (hi - lo) - 0.02, hi + 0.08 * (hi - lo) + 0.02)
    unigram = mean_unigram(ctx)
    if unigram and unigram < ax.get_ylim()[1]:
        ax.axhline(unigram, color="0.5", ls=":", lw=1, label="unigram entropy")
    style_axes(ax, f"Loss per token position in windows of {multiplier}L = {multiplier * L} tokens "
               f"(mean over seeds, bins of {rows_data[0]['per_position'][multiplier]['bin_width']})"
               if multiplier in rows_data[0]["per_position"] else f"Loss per token position at {multiplier}L",
               "token position in the window", "validation loss (nats/token)", legend_outside=True)
    return save_figure(fig, path)
