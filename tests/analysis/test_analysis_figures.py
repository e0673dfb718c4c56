"""Every figure type rendered on synthetic data has tick labels that do not overlap (their boxes measured on the
canvas after a draw: analysis.plotting.tick_label_overlaps), checked after each save (the tick_overlaps fixture)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import analysis.costs as costs
import analysis.routing.plots as routing_plots

E, T = 8, 40


def _routing_series() -> dict:
    rng = np.random.default_rng(0)
    steps = np.arange(1, T + 1, dtype=float) * 25
    out = {}
    for layer in ("layer1", "layer2", "layer3"):
        c_TE = rng.integers(0, 1500, (T, E)).astype(float)
        out[layer] = {"step": steps, "tokens_per_expert": c_TE, "load_fraction": c_TE / c_TE.sum(1, keepdims=True),
                      "maxvio": rng.random(T) * 2, "router_entropy": 2.0 - rng.random(T) * 0.01,
                      "dropped_fraction": rng.random(T) * 0.004, "dropped_tokens": rng.integers(0, 3, T).astype(float),
                      "bias": rng.normal(0, 1e-3, (T, E))}
    return out


def test_routing_figures(tmp_path, tick_overlaps):
    s = _routing_series()
    routing_plots.plot_load_heatmaps(s, "synthetic", tmp_path / "load_heatmap.png")
    routing_plots.plot_balance(s, "synthetic", tmp_path / "balance.png")
    routing_plots.plot_telemetry(s, {}, "synthetic", tmp_path / "telemetry.png")
    routing_plots.plot_bias(s, "synthetic", tmp_path / "bias.png")
    spec = {layer: {"mean": 0.5, "weighted_mean": 0.6, "uniform_baseline": 0.25} for layer in s}
    routing_plots.plot_specialisation(spec, "synthetic", tmp_path / "specialisation.png")
    routing_plots.plot_coactivation({layer: np.random.default_rng(1).random((E, E)) for layer in s}, "synthetic",
                              tmp_path / "coactivation.png")
    routing_plots.plot_saturation({100: {k: 0.5 for k in s}, 500: {k: 0.8 for k in s}}, 1000, "synthetic",
                            tmp_path / "saturation.png")
    assert [name for name, _ in tick_overlaps] == ["load_heatmap.png", "balance.png", "telemetry.png", "bias.png",
                                                    "specialisation.png", "coactivation.png", "saturation.png"]
    assert [(n, o) for n, o in tick_overlaps if o] == []


def test_cost_charts_for_few_and_many_recipes(tmp_path, tick_overlaps):
    rows = [costs.recipe_costs(Path(p), 256, 4, "bf16", 0, 1, "cuda", False)
            for p in ("recipes/dense/tiny.yaml", "recipes/llama/tiny.yaml", "recipes/mixtral/tiny.yaml")]
    costs.plot_flops(rows, tmp_path / "few_flops.png")
    costs.plot_memory(rows, tmp_path / "few_memory.png", "bf16", 0, 1)
    many = [dict(r, recipe=f"{r['recipe']}-{i}") for i in range(5) for r in rows]  # 15 recipes
    costs.plot_flops(many, tmp_path / "many_flops.png")
    costs.plot_memory(many, tmp_path / "many_memory.png", "bf16", 0, 1)
    assert len(tick_overlaps) == 4 and [(n, o) for n, o in tick_overlaps if o] == []
