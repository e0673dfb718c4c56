"""The global-batch auxiliary loss over 2 gloo processes against 1 process, on the same tokens.

Two micro-batches x1, x2 (B=2 sequences of S=12 tokens each) through one MoE layer whose only
balancing term is ``global_aux_loss``:

- run A: 1 process, 2 micro-batches (x1 then x2, each backward before the next forward, the
  gradient the mean of the two, as the trainer accumulates);
- run B: 2 processes, 1 micro-batch each (rank 0 routes x1, rank 1 x2; the gradient the mean
  over ranks, as data-parallel training averages);
- run C: 1 process, 1 micro-batch of both (2B sequences).

What ``archlab.nn.moe.balance`` says is equal, is: the step's final counts (A's running sum, B's
all-reduced counts: exact integers) and so the last micro-batch's fractions f (bit for bit); the
last micro-batch's loss (A's second = B's rank 1); B's rank-0 loss is x1's Switch loss under the
global f; and B's data-parallel gradient is C's (the Switch loss of the whole global batch). A's
first micro-batch is the documented difference: it only knew its own counts. Float values are
compared with ``assert_close`` (same ops on the same inputs; only thread scheduling could differ).
"""

import os

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn

from archlab.config.schema import BalanceConfig, FFNConfig, ModelConfig, MoEConfig

COEFF, E, K, D = 0.1, 8, 2, 16


def _layer():
    from archlab.nn.moe import MoELayer

    torch.manual_seed(0)  # the same weights in every process
    cfg = ModelConfig(d_model=D, ffn=FFNConfig(type="swiglu", bias=False),
                      moe=MoEConfig(num_experts=E, top_k=K, expert_hidden=8,
                                    balance=BalanceConfig(global_aux_loss_coeff=COEFF)))
    return MoELayer(cfg).train()


def _term(layer):
    from archlab.nn.moe.balance import GlobalAuxLoss

    (term,) = layer.balance_terms
    assert isinstance(term, GlobalAuxLoss)
    return term


def _micro_batch(layer, x_BSD: torch.Tensor, scale: float) -> dict:
    """Forward, backward of ``scale`` * aux; what the term used and what it holds afterwards."""
    _, aux = layer(x_BSD)
    (scale * aux).backward()
    term = _term(layer)
    return {"aux": aux.detach(), "f": term.last_f_E.clone(), "counts": term.step_counts.clone()}


def _rank_worker(rank: int, world: int, xs: list, out_dir: str) -> None:
    from archlab.nn.moe import start_step

    layer = _layer()
    start_step(layer)
    out = _micro_batch(layer, xs[rank], 1.0)
    out["grad"] = layer.router.gate.weight.grad.clone()
    dist.all_reduce(out["grad"])
    out["grad"] /= world  # data-parallel averaging
    start_step(layer)  # the next step starts from zero: it holds only that step's counts (both ranks)
    out["next"] = _micro_batch(layer, xs[rank], 1.0)["counts"]
    torch.save(out, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.slow
def test_parallel_global_aux_loss_two_processes_match_one_process_two_micro_batches(tmp_path):
    from archlab.nn.moe import start_step
    from archlab.nn.moe.balance import switch_aux_loss, switch_loss

    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(2, 12, D, generator=g) for _ in range(2)]
    spawn(_rank_worker, 2, xs, str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the ranks
    try:
        a = _layer()  # run A: 1 process x 2 micro-batches
        start_step(a)
        a1 = _micro_batch(a, xs[0], 0.5)
        a2 = _micro_batch(a, xs[1], 0.5)
        c = _layer()  # run C: 1 process x 1 micro-batch of both
        start_step(c)
        _micro_batch(c, torch.cat(xs), 1.0)
        with torch.no_grad():
            r1 = a.router(xs[0].reshape(-1, D))
    finally:
        torch.set_num_threads(threads)

    # the step's counts: 48 tokens, 96 slots, the same in both runs and on both ranks
    assert a2["counts"][-1] == 48 and a2["counts"][:-1].sum() == 96
    for r in ranks:
        assert torch.equal(r["counts"], a2["counts"])
        assert torch.equal(r["f"], a2["f"])  # the last micro-batch's fractions, bit for bit
    assert torch.equal(_term(c).step_counts, a2["counts"])
    # the last micro-batch's loss; rank 0's is x1's loss under the global fractions
    torch.testing.assert_close(ranks[1]["aux"], a2["aux"])
    torch.testing.assert_close(ranks[0]["aux"], COEFF * switch_loss(r1.probs_NE, a2["f"]))
    # data-parallel gradient = the gradient of the Switch loss over the whole global batch
    torch.testing.assert_close(ranks[0]["grad"], ranks[1]["grad"])
    torch.testing.assert_close(ranks[0]["grad"], c.router.gate.weight.grad)
    # run A's first micro-batch only knew its own counts (the running definition)
    torch.testing.assert_close(a1["aux"], COEFF * switch_aux_loss(r1.probs_NE, r1.experts_NK))
    assert not torch.equal(a1["f"], a2["f"])
    # each rank's next step counts both ranks' tokens of that step only
    for r in ranks:
        assert torch.equal(r["next"], a2["counts"])
