"""``kv_cache: {}``: per arm the KV-cache bytes per token of context at inference (bf16,
``archlab.costs.kv_cache_bytes``) against the final validation loss and its paired difference to
the reference arm. No settings; nothing to compute beyond the run folders and the recipes.
"""

from __future__ import annotations

from analysis.experiments import Context, Section, errbar, figure_md, fmt_ci, fmt_count, table
from analysis.measurements.base import Measurement, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes


@register
class KVCache(Measurement):
    """Validation loss against inference memory."""

    name = "kv_cache"
    title = "Validation loss against KV-cache size"

    def section(self, ctx: Context) -> Section:
        groups = ctx.arm_groups()
        ref = ctx.group(ctx.reference)
        rows, data = [], []
        for g in groups:
            kv = g.costs["kv_bytes_per_token"]
            rel = kv / ref.costs["kv_bytes_per_token"] if ref else None
            data.append({"arm": g.arm, "label": g.label, "kv_bytes_per_token": kv, "relative_kv": rel, "loss": g.loss,
                         "vs_reference": g.vs_reference})
            rows.append([f"{g.label} (`{g.arm}`)", f"{kv:.0f} B", f"{rel:.2f}" if rel else "-", fmt_ci(g.loss),
                         fmt_ci(g.vs_reference, signed=True) if g.vs_reference else "reference",
                         fmt_count(g.costs["params_total"]), fmt_count(g.speed())])
        md = ("KV cache per token of context at inference, bf16: 2 (K and V) x layers x KV heads x head dim x 2 bytes; "
              "MLA: layers x (latent + RoPE key width) x 2 bytes (`archlab.costs.kv_cache_bytes(cfg, batch=1, "
              "context=1)`, which asks the attention class).\n\n"
              + table(["arm", "KV bytes/token", "relative to reference", "final val loss", "vs reference (paired)",
                       "params", "tokens/s"], rows))
        figures: list[str] = []
        md += figure_md(figures, plot_kv(ctx, data, ctx.out / "loss_vs_kv.png"),
                        "validation loss against KV-cache bytes")
        return Section(self.title, md, figures, {"arms": data})


def plot_kv(ctx: Context, data: list[dict], path):
    """Left: each arm's loss with its interval. Right: the paired difference to the reference arm
    (same seeds), which removes the seed-to-seed spread the arms share."""
    pts = [d for d in data if d["loss"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    fig, (ax, ax_d) = plt.subplots(1, 2, figsize=(13, 5))
    for i, d in enumerate(pts):
        color = COLORS[i % len(COLORS)]
        ax.errorbar([d["kv_bytes_per_token"]], [d["loss"]["mean"]], yerr=errbar(d["loss"]), fmt="o",
                    color=color, capsize=4, label=d["label"])
        diff = d["vs_reference"] or {"mean": 0.0, "low": None}
        ax_d.errorbar([d["kv_bytes_per_token"]], [diff["mean"]], yerr=errbar(diff) if diff.get("low") is not None
                      else None, fmt="o", color=color, capsize=4, label=d["label"])
    ax_d.axhline(0.0, color="0.3", lw=0.8)
    xs = sorted({d["kv_bytes_per_token"] for d in pts})
    for a in (ax, ax_d):
        a.set_xscale("log", base=2)
        a.set_xticks(xs, [f"{x:.0f}" for x in xs], rotation=45)  # near sizes (384, 432 B) stay apart
        a.minorticks_off()
    xlabel = "KV cache per token of context (bytes, bf16, log scale)"
    style_axes(ax, "Final validation loss (95% CI over seeds)", xlabel, "final validation loss (nats/token)",
               legend=False, grid="both")
    style_axes(ax_d, f"Paired difference to {ctx.arms[ctx.reference].label} (95% CI)", xlabel,
               "loss minus the reference's (nats/token, same seeds)", legend=False, grid="both")
    # one legend for both panels (the colours are the arms'), below them: inside, it covered error bars
    handles, labels = ax.get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=min(3, len(labels)), fontsize=8)
    return save_figure(fig, path)
