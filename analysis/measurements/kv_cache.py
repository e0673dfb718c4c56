"""``kv_cache: {contexts}``: per arm the KV-cache bytes per token of context at inference (bf16,
``archlab.costs.kv_cache_bytes``) against the final validation loss and its paired difference to
the reference arm; a layer with a fixed-size recurrent state (Gated DeltaNet) adds its state per
sequence, which does not grow with the context. ``contexts`` (optional, e.g. [1, 2, 4, 8]): multiples
of each arm's training context at which the whole inference memory per sequence (KV cache + state)
is tabulated, and its bytes per token of context. Nothing to compute beyond the run folders and the
recipes.
"""

from __future__ import annotations

from analysis.experiments import (
    Context,
    Section,
    errbar,
    figure_md,
    fmt_bytes,
    fmt_ci,
    fmt_count,
    kv_and_state,
    table,
)
from analysis.measurements.base import Measurement, check_ints, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from archlab.config import load_recipe
from archlab.costs import kv_cache_bytes


def cache_bytes(cfg, contexts: list[int]) -> dict:
    """{per_token, state, at_train_context, contexts: [{context, bytes, per_token}]}: the bf16 KV cache that
    grows with the context (bytes per token), the recurrent state that does not (bytes per sequence), both per
    token at the training context, and the whole per sequence at each context (``archlab.costs.kv_cache_bytes``,
    batch 1)."""
    per_token, state = kv_and_state(cfg)
    seq = int(cfg.train.seq_len)
    at = [{"context": c, "bytes": kv_cache_bytes(cfg, batch=1, context=c, dtype="bf16")} for c in contexts]
    return {"per_token": per_token, "state": state,
            "at_train_context": kv_cache_bytes(cfg, batch=1, context=seq, dtype="bf16") / seq,
            "contexts": [{**a, "per_token": a["bytes"] / a["context"]} for a in at]}


@register
class KVCache(Measurement):
    """Validation loss against inference memory."""

    name = "kv_cache"
    title = "Validation loss against KV-cache size"
    keys = ("contexts",)

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_ints(s, "contexts", where)
        return s

    def section(self, ctx: Context) -> Section:
        groups = ctx.arm_groups()
        multiples = [int(c) for c in self.settings(ctx.record).get("contexts") or []]
        caches = {}
        for g in groups:
            arm = ctx.arms[g.arm]
            cfg = load_recipe(arm.recipe, arm.overrides)
            caches[g.arm] = cache_bytes(cfg, [m * int(cfg.train.seq_len) for m in multiples])
        ref = caches.get(ctx.reference)
        stateful = any(c["state"] for c in caches.values())
        rows, data, rows_at = [], [], []
        for g in groups:
            c = caches[g.arm]
            kv = c["per_token"]
            rel = kv / ref["per_token"] if ref and ref["per_token"] else None
            data.append({"arm": g.arm, "label": g.label, "kv_bytes_per_token": kv, "relative_kv": rel,
                         "state_bytes_per_sequence": c["state"],
                         "bytes_per_token_at_train_context": c["at_train_context"], "at_contexts": c["contexts"],
                         "loss": g.loss, "vs_reference": g.vs_reference})
            rows.append([f"{g.label} (`{g.arm}`)", f"{kv:.0f} B", *([fmt_bytes(c["state"])] if stateful else []),
                         f"{rel:.2f}" if rel is not None else "-", fmt_ci(g.loss),
                         fmt_ci(g.vs_reference, signed=True) if g.vs_reference else "reference",
                         fmt_count(g.costs["params_total"]), fmt_count(g.speed())])
            if multiples:
                rows_at.append([f"{g.label} (`{g.arm}`)", *(
                    f"{fmt_bytes(a['bytes'])} ({a['per_token']:.0f} B/token"
                    + (f", {a['bytes'] / r['bytes']:.2f}x" if ref and r["bytes"] else "") + ")"
                    for a, r in zip(c["contexts"], ref["contexts"] if ref else c["contexts"]))])
        md = ("KV cache per token of context at inference, bf16: 2 (K and V) x layers x KV heads x head dim x 2 bytes; "
              "MLA: layers x (latent + RoPE key width) x 2 bytes (`archlab.costs.kv_cache_bytes(cfg, batch=1, "
              "context)`, which asks the attention class)"
              + ("; a fixed-size recurrent state (Gated DeltaNet) is bytes per sequence, whatever the context" if
                 stateful else "") + ".\n\n"
              + table(["arm", "KV bytes/token", *(["state/sequence"] if stateful else []), "relative to reference",
                       "final val loss", "vs reference (paired)", "params", "tokens/s"], rows))
        if multiples:
            md += ("\n\nInference memory per sequence (KV cache + state, bf16) at multiples of the training context; "
                   "in brackets its bytes per token of context and its ratio to the reference's.\n\n"
                   + table(["arm", *(f"{m}x context" for m in multiples)], rows_at))
        figures: list[str] = []
        md += figure_md(figures, plot_kv(ctx, data, ctx.out / "loss_vs_kv.png", stateful),
                        "validation loss against KV-cache bytes")
        return Section(self.title, md, figures, {"arms": data})


def plot_kv(ctx: Context, data: list[dict], path, stateful: bool = False):
    """Left: each arm's loss with its interval. Right: the paired difference to the reference arm
    (same seeds), which removes the seed-to-seed spread the arms share. x: the KV cache per token; with a
    recurrent state among the arms, KV cache + state per token at the training context (a state has no
    per-token size)."""
    x_key = "bytes_per_token_at_train_context" if stateful else "kv_bytes_per_token"
    pts = [d for d in data if d["loss"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(13, 5))
    for i, d in enumerate(pts):
        color = COLORS[i % len(COLORS)]
        ax.errorbar([d[x_key]], [d["loss"]["mean"]], yerr=errbar(d["loss"]), fmt="o",
                    color=color, capsize=4, label=d["label"])
        diff = d["vs_reference"] or {"mean": 0.0, "low": None}
        ax_d.errorbar([d[x_key]], [diff["mean"]], yerr=errbar(diff) if diff.get("low") is not None
                      else None, fmt="o", color=color, capsize=4, label=d["label"])
    ax_d.axhline(0.0, color="0.3", lw=0.8)
    xs = sorted({d[x_key] for d in pts})
    for a in (ax, ax_d):
        a.set_xscale("log", base=2)
        a.set_xticks(xs, [f"{x:.0f}" for x in xs], rotation=45)  # near sizes (384, 432 B) stay apart
        a.minorticks_off()
    xlabel = ("KV cache + state per token at the training context (bytes, bf16, log scale)" if stateful
              else "KV cache per token of context (bytes, bf16, log scale)")
    style_axes(ax, "Final validation loss (95% CI over seeds)", xlabel, "final validation loss (nats/token)",
               legend=False, grid="both")
    style_axes(ax_d, f"Paired difference to {ctx.arms[ctx.reference].label} (95% CI)", xlabel,
               "loss minus the reference's (nats/token, same seeds)", legend=False, grid="both")
    # one legend for both panels (the colours are the arms'), below them: inside, it covered error bars
    handles, labels = ax.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=min(3, len(labels)), fontsize=8)
    return save_figure(fig, path)
