"""analysis.measurements.throughput: the interleaved benchmark runs the trainer's step, MoE bookkeeping included."""

import torch

from analysis.measurements import throughput

TINY = ["model.vocab_size=384", "data.max_bytes=150000", "model.d_model=32", "model.n_layers=2",
        "train.seq_len=32", "train.micro_batch_size=4", "train.warmup_steps=0"]


def test_global_batch_balancing_and_the_bias_update_run_in_the_benchmark_step(tmp_path):
    """Global-batch balancing refuses a forward outside an opened step, so the benchmark opens each
    step as the trainer does; the aux-loss-free bias moves, so the step's bias update ran."""
    overrides = TINY + [f"data.cache_dir={tmp_path}", "model.moe.balance.global_aux_loss_coeff=0.01",
                        "model.moe.balance.bias_update_rate=0.01", "train.grad_accum=2"]
    step = throughput._stepper("recipes/mixtral/tiny.yaml", overrides)
    model = step.model
    bias = [b.detach().clone() for n, b in model.named_buffers() if n.endswith("expert_bias")]
    assert bias and step() == 2 * 4 * 32
    after = [b for n, b in model.named_buffers() if n.endswith("expert_bias")]
    assert any(not torch.equal(a, b) for a, b in zip(bias, after))


def test_benchmark_reports_each_arm(tmp_path):
    arms = {"dense": ("recipes/llama/tiny.yaml", TINY + [f"data.cache_dir={tmp_path}"]),
            "moe": ("recipes/mixtral/tiny.yaml", TINY + [f"data.cache_dir={tmp_path}"])}
    result = throughput.benchmark(arms, steps=1, rounds=2, warmup=1, threads=1)
    assert set(result) == {"dense", "moe"}
    for r in result.values():
        assert r["tokens_per_s"] > 0 and len(r["rounds"]) == 2


def test_the_benchmark_step_is_the_trainers_step(tmp_path):
    """Three benchmark steps leave the weights bitwise where three steps of a run leave them: both
    call Trainer.optimizer_step (lr schedule, clipping, optimizer, MoE bookkeeping included)."""
    from archlab.config import load_recipe
    from archlab.train.checkpoint import load_model
    from archlab.train.loop import Trainer

    overrides = TINY + [f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=3", "train.warmup_steps=1",
                        "model.moe.balance.bias_update_rate=0.01"]
    step = throughput._stepper("recipes/mixtral/tiny.yaml", overrides, out_dir=str(tmp_path / "bench"))
    for _ in range(3):
        step()
    cfg = load_recipe("recipes/mixtral/tiny.yaml", overrides + ["train.seed=0", f"train.out_dir={tmp_path / 'run'}",
                                                                 "train.run_name=r"])
    Trainer(cfg).run()
    model, _ = load_model(tmp_path / "run" / "r")
    bench = dict(step.model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(bench[name].detach(), p.detach()), name
    assert any(torch.count_nonzero(b) for n, b in step.model.named_buffers() if n.endswith("expert_bias"))
