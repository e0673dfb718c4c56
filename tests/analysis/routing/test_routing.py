"""analysis.routing: OLMoE statistics against hand computations, and the program on real MoE runs."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from analysis.routing import plots
from analysis.routing.capture import capture_topk, moe_routers
from analysis.routing.checkpoint import held_out_maxvio
from analysis.routing.cli import main
from analysis.routing.report import _markdown, analyse
from analysis.routing.series import load_matrix, training_series
from analysis.routing.stats import coactivation, maxvio_of_choices, saturation, specialisation
from analysis.runs import open_run

# ------------------------------------------------------------------ statistics


def _spec_reference(tokens, experts_NK, min_count):
    """Looped OLMoE specialisation: per token id, max over experts of (occurrences routed there) / occurrences."""
    per_id = {}
    for t, row in zip(tokens.tolist(), experts_NK.tolist()):
        per_id.setdefault(t, [0, Counter()])
        per_id[t][0] += 1
        per_id[t][1].update(row)
    vals = [max(c.values()) / n for n, c in per_id.values() if n >= min_count]
    return float(np.mean(vals))


def test_specialisation_matches_a_looped_reference():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 20, 2000)
    experts = np.stack([rng.choice(8, 2, replace=False) for _ in range(2000)])
    s = specialisation(tokens, experts, 8, min_count=5)
    assert s["mean"] == pytest.approx(_spec_reference(tokens, experts, 5))
    assert s["uniform_baseline"] == pytest.approx(2 / 8)


def test_specialisation_is_one_for_id_determined_routing_and_k_over_e_when_spread_evenly():
    tokens = np.repeat(np.arange(10), 8)  # each id 8 times
    determined = np.stack([[t % 4, (t + 1) % 4] for t in tokens])
    assert specialisation(tokens, determined, 4)["mean"] == pytest.approx(1.0)
    # each id's 8 occurrences cycle over the 4 expert pairs (0,1),(2,3),(0,2),(1,3): every expert 4 of 8 times
    pairs = np.array([[0, 1], [2, 3], [0, 2], [1, 3]] * 2)
    spread = np.concatenate([pairs] * 10)
    assert specialisation(tokens, spread, 4)["mean"] == pytest.approx(0.5)  # = K/E, the floor


def test_coactivation_counts_all_pairs_of_chosen_experts():
    experts = np.array([[0, 1, 2], [0, 1, 3], [2, 3, 1]])  # K=3, E=5 (expert 4 never chosen)
    C = coactivation(experts, 5)
    assert C[0, 1] == pytest.approx(2 / 2)  # 0 chosen twice, both with 1
    assert C[0, 2] == pytest.approx(1 / 2) and C[0, 3] == pytest.approx(1 / 2)
    assert C[1, 0] == pytest.approx(2 / 3) and C[2, 3] == pytest.approx(1 / 2)
    assert C[3, 2] == pytest.approx(1 / 2) and np.all(np.diag(C)[:4] == 0)
    assert np.all(np.isnan(C[4]))


def test_saturation_is_the_mean_topk_overlap():
    a = np.array([[0, 1], [2, 3], [4, 5]])
    assert saturation(a, a) == 1.0
    assert saturation(a, a[:, ::-1]) == 1.0  # order within top-K does not matter
    b = np.array([[1, 7], [6, 7], [5, 4]])
    assert saturation(a, b) == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    with pytest.raises(ValueError, match="same tokens"):
        saturation(a, a[:2])


# ------------------------------------------------------------------ real runs


def test_capture_topk_hooks_every_moe_router_and_cleans_up(analysis_runs):
    from archlab.train.checkpoint import load_model

    model, cfg = load_model(analysis_runs["deepseek-d32"])
    routers = moe_routers(model)
    assert list(routers) == ["layer1"]  # first_k_dense=1: layer 0 is dense
    ids = torch.randint(0, cfg.model.vocab_size, (3, 32))
    topk = capture_topk(model, ids, batch_size=2)
    e = topk["layer1"]
    K, E = cfg.model.moe.top_k, cfg.model.moe.num_experts
    assert e.shape == (3 * 32, K) and e.min() >= 0 and e.max() < E
    assert all(len(set(row)) == K for row in e.tolist())
    assert not routers["layer1"]._forward_hooks
    # the same tokens give the same choices: the capture reads the model, not noise
    np.testing.assert_array_equal(capture_topk(model, ids)["layer1"], e)


def test_training_series_reads_loads_and_bias(analysis_runs):
    mix = training_series(open_run(analysis_runs["mixtral-d32"]))
    assert list(mix) == ["layer0", "layer1"]
    load = load_matrix(mix["layer0"])
    assert load.shape == (10, 4)  # a record every 2 of 20 steps, 4 experts
    np.testing.assert_allclose(load.sum(axis=1), 1.0, atol=1e-6)
    assert np.all(np.diff(mix["layer0"]["step"]) > 0)
    ds = training_series(open_run(analysis_runs["deepseek-d32"]))
    assert ds["layer1"]["bias"].shape == (10, 16)
    assert np.abs(ds["layer1"]["bias"][-1]).max() > 0  # the aux-loss-free bias moved


def test_routing_program_on_a_real_moe_run(analysis_runs, tmp_path, capsys):
    s = analyse(str(analysis_runs["mixtral-d32"]), tmp_path, max_tokens=2048)
    assert "routing: bias.png not written: no aux-loss-free selection bias" in capsys.readouterr().out
    health = s["expert_health"]["layer0"]
    assert health["window_steps"] == [16.0, 20.0] and health["records"] == 2  # the last fifth of 20 steps
    assert set(health["dead"]).isdisjoint(health["starved"]) and len(health["tokens_per_step"]) == 4
    for name in ("load_heatmap.png", "balance.png", "specialisation.png", "coactivation.png", "saturation.png"):
        assert name in s["files"] and (tmp_path / name).stat().st_size > 5000
    assert "bias.png" not in s["files"]  # Mixtral recipe: no aux-loss-free bias
    ck = s["checkpoint"]
    assert ck["step"] == 20 and ck["tokens"] == 2048
    assert set(ck["saturation"]) == {"10"}  # the other kept checkpoint
    assert all(0.0 <= v <= 1.0 for v in ck["saturation"]["10"].values())
    for layer, sp in ck["specialisation"].items():
        assert sp["uniform_baseline"] - 1e-9 <= sp["mean"] <= 1.0
    assert len(ck["top_tokens"]["layer0"]) == 4
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["training"]["layer0"]["records"] == 10
    md = (tmp_path / "summary.md").read_text()
    assert "# Routing of mixtral-d32" in md and "| layer | mean tokens per expert per step | dead experts |" in md
    expert_lines = [line for line in md.splitlines() if line.startswith("- expert ")]
    assert len(expert_lines) == 4 and all(line.split(":", 1)[1].strip() for line in expert_lines)  # none blank


def test_routing_program_with_text_and_bias(analysis_runs, tmp_path):
    text = tmp_path / "held_out.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 60)
    out = tmp_path / "out"
    assert main([str(analysis_runs["deepseek-d32"]), "--out", str(out), "--text", str(text),
                 "--checkpoint", str(analysis_runs["deepseek-d32"] / "checkpoints" / "step_00000010"),
                 "--compare", str(analysis_runs["deepseek-d32"])]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert "bias.png" in s["files"] and s["checkpoint"]["step"] == 10
    assert s["checkpoint"]["source"] == "1 --text file(s)"
    assert set(s["checkpoint"]["saturation"]) == {"20"}


def test_routing_program_fails_clearly(analysis_runs, tmp_path, capsys):
    out = str(tmp_path / "o")
    cases = [
        ([str(tmp_path / "missing")], "no such folder"),
        ([str(analysis_runs["dense-d32"])], "dense run"),
        ([str(analysis_runs["killed"])], "--allow-incomplete"),
        ([str(analysis_runs["mixtral-d32"]), "--checkpoint", str(tmp_path)], "not an archlab run folder"),
        ([str(analysis_runs["mixtral-d32"]), "--text", str(tmp_path / "none.txt")], "no such file"),
    ]
    (tmp_path / "o").mkdir()
    for args, message in cases:
        assert main(args + ["--out", out]) == 2, args
        assert message in capsys.readouterr().err, args


def test_maxvio_of_choices_over_all_tokens_and_per_batch():
    # E = 4, K = 1: loads 4, 2, 1, 1 over 8 tokens -> max / mean - 1 = 4 / 2 - 1 = 1
    e = np.array([[0], [0], [0], [0], [1], [1], [2], [3]])
    assert maxvio_of_choices(e, 4, batch_tokens=8) == {"global": 1.0, "batch": 1.0}
    # two batches of 4 tokens: [0, 0, 0, 0] (max 4, mean 1: 3) and [1, 1, 2, 3] (2 / 1 - 1 = 1); global stays 1
    assert maxvio_of_choices(e, 4, batch_tokens=4) == {"global": 1.0, "batch": 2.0}
    balanced = np.array([[0, 1], [2, 3], [1, 0], [3, 2]])  # K = 2, every expert twice
    assert maxvio_of_choices(balanced, 4, batch_tokens=8)["global"] == 0.0


def test_held_out_maxvio_reads_the_final_weights_on_the_validation_split(analysis_runs):
    from archlab.data import prepare_data
    from archlab.train.checkpoint import load_model

    run = analysis_runs["deepseek-d32"]
    got = held_out_maxvio(run, max_tokens=1024)
    model, cfg = load_model(run)
    S = int(cfg.train.seq_len)
    ids = np.asarray(prepare_data(cfg).val[:1024], dtype=np.int64)
    windows = torch.from_numpy(ids[: len(ids) // S * S].reshape(-1, S).copy())
    e = capture_topk(model, windows)["layer1"]
    assert got["layers"]["layer1"] == maxvio_of_choices(e, cfg.model.moe.num_experts, got["batch_tokens"])
    assert got["tokens"] == windows.numel() and got["global"] == got["layers"]["layer1"]["global"] >= 0


# ------------------------------------------------------------------ what the figures and summary say


def test_the_balance_legend_covers_no_panel(monkeypatch, tmp_path):
    saved = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: saved.append(fig) or path)
    steps = np.array([10, 20, 30])
    series = {f"layer{i}": {"step": steps, "maxvio": np.array([0.9, 0.4, 0.5]),
                            "router_entropy": np.array([2.06, 2.07, 2.076]),
                            "load_fraction": np.full((3, 8), 1 / 8)} for i in range(4)}
    plots.plot_balance(series, "run", tmp_path / "balance.png")
    fig = saved[0]
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)]
    labels = [t.get_text() for lg in legends for t in lg.get_texts()]
    assert labels.count("layer0") == 1 and "uniform over E=8: ln E" in labels  # one legend for the panels
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_top_tokens_say_what_the_share_is_under_top_k():
    run = SimpleNamespace(name="moe", family="mixtral", status="finished", reason="")
    ck = {"step": 30, "tokens": 100, "source": "validation split", "top_k": 2, "saturation": {},
          "spec": {"layer0": {"mean": 0.9, "weighted_mean": 0.9, "n_token_ids": 3, "uniform_baseline": 0.25}},
          "top_tokens": {"layer0": [[{"text": ":", "count": 649, "share_of_id": 1.0}],
                                    [{"text": ":", "count": 649, "share_of_id": 1.0}]]}}
    md = _markdown(run, {}, ck, [])
    assert "share of this token's occurrences routed to the expert" in md
    assert "top-2: every occurrence goes to 2 experts, so a token reaches up to 100% in each of 2 experts" in md
    assert "- expert 0: ':' (649, 100%)" in md and "- expert 1: ':' (649, 100%)" in md
