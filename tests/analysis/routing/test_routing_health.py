"""analysis.routing.health and the routing figures on synthetic routing records with a known starved expert:
dead and starved experts by id over a window, the load heat map's diverging scale centred on uniform, one
colour scale across the co-activation panels."""

from __future__ import annotations

import numpy as np
import pytest

import analysis.routing.plots as routing_plots
from analysis.routing.health import expert_health, health_table

E = 4


def _series() -> dict:
    """10 records, a step of 10 tokens per record-step (record every 10 steps, 400 slots per record): in layer0
    expert 2 is starved (under 10% of the mean 100) from step 60 on and expert 3 dead from step 80 on; layer1
    uniform."""
    steps = np.arange(10, 110, 10, dtype=float)
    c0 = np.tile([100.0, 100.0, 100.0, 100.0], (10, 1))
    c0[5:, :] = [150.0, 145.0, 5.0, 100.0]  # 5 < 0.1 * 100: starved
    c0[7:, :] = [200.0, 195.0, 5.0, 0.0]  # and expert 3 dead
    c1 = np.full((10, E), 100.0)
    return {"layer0": {"step": steps, "tokens_per_expert": c0}, "layer1": {"step": steps, "tokens_per_expert": c1}}


def test_starved_and_dead_experts_are_named_by_id_over_the_window():
    h = expert_health(_series())  # default window: the last fifth of 100 steps, records at 90 and 100
    assert h["layer0"]["window_steps"] == [80.0, 100.0] and h["layer0"]["records"] == 2
    assert h["layer0"]["dead"] == [3] and h["layer0"]["starved"] == [2]
    assert h["layer0"]["mean_tokens_per_step"] == pytest.approx(100 * 2 / 20)
    assert h["layer0"]["min_share_of_uniform"] == 0.0
    assert h["layer1"]["dead"] == [] and h["layer1"]["starved"] == [] and h["layer1"]["min_share_of_uniform"] == 1.0
    # over the whole run (mean 1000 tokens an expert) expert 2 got 5 * 100 + 5 * 5 = 525 and expert 3 700:
    # neither dead nor under 10% of uniform; under 75% both are
    whole = expert_health(_series(), window=1000)
    assert whole["layer0"]["records"] == 10 and whole["layer0"]["dead"] == [] and whole["layer0"]["starved"] == []
    assert expert_health(_series(), fraction=0.75, window=1000)["layer0"]["starved"] == [2, 3]
    assert expert_health(_series(), fraction=0.6, window=1000)["layer0"]["starved"] == [2]
    lines = health_table(h)
    assert "under 10% of the uniform share" in lines[0] and "steps 80-100" in lines[0]
    assert "| layer0 | 10.0 | 1: 3 | 1: 2 | 0.00 |" in lines
    assert health_table({})[0].startswith("(no token counts")


@pytest.fixture
def figures(monkeypatch):
    """The figures the routing plots save, kept open for inspection."""
    kept = []
    monkeypatch.setattr(routing_plots, "save_figure", lambda fig, path: kept.append(fig) or path)
    yield kept
    import matplotlib.pyplot as plt

    for fig in kept:
        plt.close(fig)


def test_load_heatmap_is_diverging_and_centred_on_uniform(tmp_path, figures):
    assert routing_plots.plot_load_heatmaps(_series(), "synthetic", tmp_path / "h.png") is not None
    images = [im for ax in figures[0].axes for im in ax.get_images()]
    assert len(images) == 2 and len({id(im.norm) for im in images}) == 2
    assert all(im.norm.vcenter == 1.0 and im.norm.vmin == 0.0 for im in images)
    assert len({(im.norm.vmin, im.norm.vmax) for im in images}) == 1  # one scale for both panels
    im = images[0]
    rgba = im.to_rgba(im.get_array())  # (E, T, 4): expert rows, record columns
    white = np.array(im.cmap(0.5)[:3])
    assert np.abs(rgba[0, 0, :3] - white).max() < 0.05  # uniform load: the centre colour
    assert rgba[2, -1, 2] > 0.4 and rgba[2, -1, 0] < 0.2  # starved: deep blue
    assert rgba[0, -1, 0] > rgba[0, -1, 2]  # twice uniform: red


def test_coactivation_panels_share_one_colour_scale(tmp_path, figures):
    coact = {"layer0": np.array([[np.nan, 0.2], [0.1, np.nan]]), "layer1": np.array([[0.0, 0.9], [0.5, 0.0]])}
    routing_plots.plot_coactivation(coact, "synthetic", tmp_path / "c.png")
    images = [im for ax in figures[0].axes for im in ax.get_images()]
    assert len(images) == 2 and {(im.norm.vmin, im.norm.vmax) for im in images} == {(0.0, 0.9)}
    assert sum(ax.get_label() == "<colorbar>" for ax in figures[0].axes) == 1
