"""Routing telemetry and the router trace through a real (tiny) training run: the trace written
during training read back by ``analysis.routing.read_trace`` (shapes, the chosen experts equal the
top-k of the traced logits, the traced rows are the first micro-batch's tokens and its logits),
tracing off by default and refused on dense models, the telemetry keys of the routing records,
and the plots of ``analysis.routing``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import archlab
from analysis.routing.report import analyse
from analysis.routing.series import global_series, maxvio_percentiles, training_series
from analysis.routing.trace import read_trace
from analysis.runs import RunError, open_run
from archlab.train.router_trace import TRACE_TOKENS, sample_tokens, tracer_for

L, E, K, B, S, A = 3, 4, 2, 4, 32, 2  # MoE layers, experts, top-k, micro batch, sequence, micro-batches per step
TINY = ["model.vocab_size=384", "model.d_model=32", f"model.n_layers={L}", "model.n_heads=2", "model.n_kv_heads=1",
        "model.max_seq_len=64", f"train.seq_len={S}", f"train.micro_batch_size={B}", f"train.grad_accum={A}",
        "train.warmup_steps=1", "train.log_every=1", "train.eval_every=100", "train.eval_batches=1",
        "train.ckpt_every=100", "train.eval_context_multipliers=[1]", "data.max_bytes=120000",
        f"model.moe.num_experts={E}", f"model.moe.top_k={K}", "model.moe.expert_hidden=16"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"traced": a 3-step run traced every step (capacity 0.75: slots drop), with a checkpoint at
    step 2; "plain": the same recipe without the trace key}, and their recipes."""
    from archlab.train import train

    root = tmp_path_factory.mktemp("telemetry")
    base = TINY + [f"data.cache_dir={root / 'cache'}", f"train.out_dir={root / 'runs'}"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = {}
    try:
        for name, extra in (("traced", ["train.max_steps=3", "train.router_trace_every=1", "train.ckpt_steps=[2]",
                                        "model.moe.capacity_factor=0.75", "model.moe.min_capacity=1"]),
                            ("plain", ["train.max_steps=2"])):
            cfg = archlab.load_recipe("recipes/mixtral/tiny.yaml", base + extra + [f"train.run_name={name}"])
            out[name] = (train(cfg)["run_dir"], cfg)
    finally:
        torch.set_num_threads(threads)
    return out


def test_trace_round_trip(runs):
    run_dir, cfg = runs["traced"]
    t = read_trace(run_dir)
    T = min(TRACE_TOKENS, B * S)
    assert t["steps"].tolist() == [1, 2, 3] and not t["skipped"].any()
    assert t["layers"] == [f"layer{i}" for i in range(L)]
    assert t["experts"].shape == (3, T, L, K) and t["weights"].shape == (3, T, L, K)
    assert t["dropped"].shape == (3, T, L, K) and t["logits"].shape == (3, T, L, E)
    assert t["token_index"].shape == t["token_id"].shape == (3, T)
    assert set(t["legend"]) >= {"experts", "weights", "logits", "dropped", "token_index"}
    # softmax top-k without bias or groups: the chosen experts are the top-k of the traced logits, in order
    np.testing.assert_array_equal(t["experts"], np.argsort(-t["logits"], axis=-1, kind="stable")[..., :K])
    p = np.exp(t["logits"] - t["logits"].max(-1, keepdims=True))
    top = np.take_along_axis(p / p.sum(-1, keepdims=True), t["experts"], axis=-1)
    np.testing.assert_allclose(t["weights"], top / top.sum(-1, keepdims=True), rtol=1e-5)  # renormalised top-k
    assert t["dropped"].any() and not t["dropped"].all()  # capacity 0.75 drops some slots
    # the sampled rows: deterministic per (seed, step), sorted, within the micro-batch
    for i, step in enumerate(t["steps"]):
        np.testing.assert_array_equal(t["token_index"][i], sample_tokens(B * S, int(step), 0).numpy())
    np.testing.assert_array_equal(t["row"] * S + t["position"], t["token_index"])
    # they are the tokens of the first micro-batch of each step
    from archlab.data import TokenBatches, prepare_data

    batches = TokenBatches(prepare_data(cfg).train, S, B, A, 0, 1, 0)
    for i, step in enumerate(t["steps"]):
        x_N = batches.get(int(step) - 1, 0)[:, :-1].reshape(-1)
        np.testing.assert_array_equal(t["token_id"][i], x_N[t["token_index"][i]].numpy())
    # and its logits: step 3's forward ran on the weights of the step-2 checkpoint, micro-batch 0 (not 1)
    from archlab.nn.moe import moe_layers
    from archlab.train.checkpoint import load_model

    model, _ = load_model(f"{run_dir}/checkpoints/step_00000002")
    logits = []
    hooks = [layer.router.register_forward_hook(lambda m, i, out: logits.append(out.logits_NE))
             for layer in moe_layers(model)]
    with torch.no_grad():
        model(batches.get(2, 0)[:, :-1])
    for h in hooks:
        h.remove()
    ref_TLE = torch.stack(logits, dim=1)[torch.from_numpy(t["token_index"][2])].numpy()
    np.testing.assert_allclose(t["logits"][2], ref_TLE, rtol=1e-4, atol=1e-5)
    lines = (Path(run_dir) / "router_trace" / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    assert (t["seconds"] > 0).all()  # the trace's host cost, measured per step


def test_trace_is_off_by_default_and_refused_where_it_means_nothing(runs, tmp_path):
    run_dir, cfg = runs["plain"]
    assert cfg.train.router_trace_every == 0
    assert not (open_run(run_dir).path / "router_trace").exists()
    with pytest.raises(RunError, match="no router trace"):
        read_trace(run_dir)
    with pytest.raises(archlab.RecipeError, match="router_trace_every=2: only used when model.moe is set"):
        archlab.load_recipe("recipes/llama/tiny.yaml", ["train.router_trace_every=2"])
    with pytest.raises(archlab.RecipeError, match="train.router_trace_every=-1: must be >= 0"):
        archlab.load_recipe("recipes/mixtral/tiny.yaml", ["train.router_trace_every=-1"])  # refused at load
    assert tracer_for(tmp_path, cfg.train, is_main=True, is_moe=True) is None
    on = archlab.load_recipe("recipes/mixtral/tiny.yaml", ["train.router_trace_every=4"])
    assert tracer_for(tmp_path, on.train, is_main=False, is_moe=True) is None  # only the main process traces
    tracer = tracer_for(tmp_path, on.train, is_main=True, is_moe=True)
    assert [s for s in range(1, 13) if tracer.due(s)] == [4, 8, 12]


def test_routing_records_carry_the_telemetry(runs):
    run = open_run(runs["traced"][0])
    rows = run.routing_rows
    assert [r["step"] for r in rows] == [1, 2, 3] and all(r["moe/window_steps"] == 1 for r in rows)
    for r in rows:
        for i in range(L):
            p = f"moe/layer{i}/"
            counts = r[p + "tokens_per_expert"]
            assert r[p + "tokens_per_expert_min"] == min(counts) and r[p + "tokens_per_expert_max"] == max(counts)
            assert r[p + "tokens_per_expert_std"] == pytest.approx(float(np.std(counts)))
            assert r[p + "dead_experts"] == sum(c == 0 for c in counts)
            assert 0 <= r[p + "dropped_tokens"] <= r[p + "dropped_slots"] <= r[p + "tokens"] * K
        maxvio = [r[f"moe/layer{i}/maxvio"] for i in range(L)]
        for q in (50, 90, 95):
            assert r[f"moe/maxvio_p{q}"] == pytest.approx(float(np.percentile(maxvio, q)))
        assert r["moe/maxvio_max"] == pytest.approx(max(maxvio))
        assert r["moe/dropped_tokens"] == sum(r[f"moe/layer{i}/dropped_tokens"] for i in range(L))
    assert any(r["moe/dropped_tokens"] > 0 for r in rows)
    # analysis reads them back; the percentiles it would compute for runs without them agree
    series, totals = training_series(run), global_series(run)
    logged = maxvio_percentiles(series, totals)
    computed = maxvio_percentiles(series)
    for key in ("p50", "p90", "p95", "max"):
        np.testing.assert_allclose(logged[key], computed[key], rtol=1e-9)
    assert totals["window_steps"].tolist() == [1.0, 1.0, 1.0]


def test_routing_program_plots_the_telemetry(runs, tmp_path):
    s = analyse(runs["traced"][0], tmp_path, use_checkpoint=False)
    assert "telemetry.png" in s["files"] and (tmp_path / "telemetry.png").stat().st_size > 20000
    assert s["router_trace"]["steps"] == 3 and s["router_trace"]["tokens_per_step"] == min(TRACE_TOKENS, B * S)
    assert set(s["maxvio_across_layers_last"]) == {"p50", "p90", "p95", "max"}
    assert "dead_experts_last" in s["training"]["layer0"] and "dropped_tokens_last" in s["training"]["layer0"]
    assert "dead experts last" in (tmp_path / "summary.md").read_text()
    plain = analyse(runs["plain"][0], tmp_path / "plain", use_checkpoint=False)
    assert "telemetry.png" in plain["files"] and "router_trace" not in plain


def test_a_resumed_trace_lists_each_step_once(tmp_path):
    """A launch resumed at step 1 cuts steps.jsonl back to it; re-traced steps replace their files."""
    from archlab.train.router_trace import RouterTracer

    def fake(value: float) -> dict:
        return {"layers": ["layer0"], "experts": torch.zeros(2, 1, 1, dtype=torch.long),
                "weights": torch.full((2, 1, 1), value), "dropped": torch.zeros(2, 1, 1, dtype=torch.bool),
                "logits": torch.zeros(2, 1, 3), "token_index": torch.tensor([0, 5])}

    first = RouterTracer(tmp_path, every=1, seed=0)
    first.start(0)
    for step in (1, 2, 3):
        first.write(step, fake(float(step)), torch.tensor([7, 8]), seq_len=4)
    resumed = RouterTracer(tmp_path, every=1, seed=0)
    resumed.start(1)  # the checkpoint was at step 1: steps 2 and 3 are traced again
    resumed.write(2, fake(20.0), torch.tensor([7, 8]), seq_len=4)
    t = read_trace(tmp_path)
    assert t["steps"].tolist() == [1, 2] and t["weights"][:, 0, 0, 0].tolist() == [1.0, 20.0]
    assert t["row"].tolist() == [[0, 1]] * 2 and t["position"].tolist() == [[0, 1]] * 2
