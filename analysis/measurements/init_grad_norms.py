"""``init_grad_norms: {depths, batches, seeds, arms}``: per-layer gradient norms at initialisation
(:func:`init_grad_norms`) of each listed arm (``arms``, default all) at each depth (``depths``,
default [2, 4, 8] layers) and seed (``seeds``, default the spec's), over ``batches`` training
batches (default 2); nothing is trained; each result cached under
``<out>/measurements/init_grad_norms/``. The report: the norm per layer and the last/first ratio.

Why (Xiong et al. 2020, "On Layer
Normalization in the Transformer Architecture", Fig. 3): with Post-LN the gradients of the
parameters near the output are large and grow with the layer index, which is why Post-LN needs a
learning-rate warmup; with Pre-LN they are about the same in every layer and shrink with depth.

    from analysis.measurements.init_grad_norms import init_grad_norms
    init_grad_norms("recipes/vanilla/tiny.yaml", ["model.norm.placement=pre"], seed=0, batches=2)

The model is built exactly as the trainer builds it for ``train.seed = seed`` (same initial
weights), and the loss is the trainer's (next-token cross-entropy plus the MoE balancing losses)
on the first ``batches`` training batches of that seed; gradients of one batch at a time, the
norms averaged over batches.

Shape legend: B windows, S positions.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from analysis.experiment_spec import Spec
from analysis.experiments import Context, Section, figure_md, fmt_ci, t_interval, table
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
from archlab.data import TokenBatches
from archlab.model.build import build_model
from archlab.objectives import token_data
from archlab.objectives.causal_lm import CausalLM


def block_grad_norms(model) -> list[float]:
    """L2 norm of the gradients of all parameters of each block (layer 0 first)."""
    norms = []
    for block in model.blocks:
        sq = sum(float(p.grad.double().pow(2).sum()) for p in block.parameters() if p.grad is not None)
        norms.append(math.sqrt(sq))
    return norms


def init_grad_norms(recipe: str, overrides: Sequence[str], seed: int, batches: int = 2) -> dict:
    """{"per_layer": [mean over batches of each block's gradient norm], "loss": mean initial loss,
    "embedding": gradient norm of the token embedding, "n_layers", "seed", "batches"}."""
    cfg = load_recipe(recipe, [*overrides, f"train.seed={seed}"])
    t = cfg.train
    data = token_data(cfg)
    torch.manual_seed(seed)  # as the trainer: the same initial weights as the run of this seed
    model = build_model(cfg)
    model.train()
    stream = TokenBatches(data.train, int(t.seq_len), int(t.micro_batch_size), 1, 0, 1, seed)
    per_layer, losses, embed = [], [], []
    for step in range(batches):
        x_BS1 = stream.get(step)
        model.zero_grad(set_to_none=True)
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        out = model(inputs_BS, targets=targets_BS)
        (out.loss + out.aux_loss).backward()
        per_layer.append(block_grad_norms(model))
        embed.append(float(model.embed.weight.grad.norm()))
        losses.append(float(out.loss.detach()))
    n_layers = len(per_layer[0])
    return {"per_layer": [sum(b[i] for b in per_layer) / batches for i in range(n_layers)],
            "loss": sum(losses) / batches, "embedding": sum(embed) / batches, "n_layers": n_layers,
            "seed": seed, "batches": batches}


@register
class InitGradNorms(Measurement):
    """Gradient norm of each block's parameters at initialisation, per arm, depth and seed."""

    name = "init_grad_norms"
    title = "Gradient norms at initialisation"
    keys = ("arms", "depths", "batches", "seeds")

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_names(s, "arms", where)
        check_ints(s, "depths", where)
        check_int(s, "batches", where)
        check_ints(s, "seeds", where, minimum=0)
        return s

    def run(self, record: dict, log=print) -> list[dict]:
        m = self.settings(record)
        arms = {a.name: a for a in record_arms(record)}
        listed = m.get("arms") or list(arms)
        depths = [int(d) for d in m.get("depths", [2, 4, 8])]
        batches = int(m.get("batches", 2))
        seeds = m.get("seeds") or Spec.from_dict(record["spec"]).seeds
        folder = measurement_folder(record) / self.name
        out = []
        for name in listed:
            if name not in arms:
                raise ValueError(f"measurements.init_grad_norms.arms: {name!r} is not an arm (arms: {', '.join(arms)})")
            arm = arms[name]
            for depth in depths:
                for seed in seeds:
                    overrides = [*arm.overrides, f"model.n_layers={depth}"]
                    settings = {"recipe": arm.recipe, "overrides": overrides, "seed": seed, "batches": batches}
                    path = folder / f"{name}-d{depth}-seed{seed}.json"
                    if not path.is_file():
                        log(f"init_grad_norms: {name}, {depth} layers, seed {seed}")
                    result = cached(path, settings, lambda: init_grad_norms(arm.recipe, overrides, seed, batches))
                    out.append({"arm": name, "depth": depth, "seed": seed, "result": result})
        return out

    def section(self, ctx: Context) -> Section:
        results = ctx.measures.get("init_grad_norms") or []
        groups: dict[tuple, list] = {}
        for r in results:
            groups.setdefault((r["arm"], r["depth"]), []).append(r["result"])
        rows, data = [], []
        for (arm, depth), res in groups.items():
            per_layer = np.array([x["per_layer"] for x in res])  # (seeds, L)
            mean = per_layer.mean(axis=0)
            ratio = t_interval(list(per_layer[:, -1] / per_layer[:, 0]))
            data.append({"arm": arm, "depth": depth, "per_layer_mean": mean.tolist(), "per_layer": per_layer.tolist(),
                         "last_over_first": ratio, "loss": t_interval([x["loss"] for x in res])})
            rows.append([ctx.arms[arm].label, depth, ", ".join(f"{v:.3g}" for v in mean), fmt_ci(ratio, 2),
                         f"{mean.sum():.3g}"])
        md = ("Gradient norm of each block's parameters at initialisation (mean over "
              f"{len(ctx.measures['init_grad_norms'] and {r['seed'] for r in results})} seeds, "
              f"{results[0]['result']['batches'] if results else 0} training batches each; the weights the runs "
              "start from). Xiong et al. (2020): with Post-LN the gradient norm grows towards the last layers; with "
              "Pre-LN it is about flat across layers and decreases with depth.\n\n"
              + table(["placement", "layers", "gradient norm per layer (layer 1 first)", "last / first layer [95% CI]",
                       "sum over layers"], rows))
        figures: list[str] = []
        md += figure_md(figures, plot_grad_norms(ctx, data, ctx.out / "init_grad_norms.png"),
                        "gradient norms at initialisation")
        return Section(self.title, md, figures, {"groups": data})


def plot_grad_norms(ctx: Context, data: list[dict], path):
    if not data:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    arms = list(dict.fromkeys(d["arm"] for d in data))
    depths = sorted({d["depth"] for d in data})
    markers = ["o", "s", "^", "D", "v"]
    for d in data:
        color = COLORS[arms.index(d["arm"]) % len(COLORS)]
        per = np.array(d["per_layer"])
        x = np.arange(1, d["depth"] + 1)
        ax.plot(x, per.mean(axis=0), marker=markers[depths.index(d["depth"]) % len(markers)], color=color,
                label=f"{ctx.arms[d['arm']].label}, {d['depth']} layers")
        if len(per) > 1:
            ax.fill_between(x, per.min(axis=0), per.max(axis=0), color=color, alpha=0.12)
    ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    style_axes(ax, "Gradient norm per layer at initialisation (shaded: min-max over seeds)",
               "layer (1 = next to the embedding)", "gradient norm of the block's parameters (log scale)",
               legend_outside=True)
    return save_figure(fig, path)
