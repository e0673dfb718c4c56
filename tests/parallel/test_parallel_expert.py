"""Expert parallelism over 2 gloo processes: the sharded layer computes what the unsharded one
does (outputs, input/router gradients, and expert gradients summed over ranks), exchanging
exactly the routed rows (no padding), and its expert parameters land in DeepSpeed's MoE
optimizer groups."""

import os

import pytest
import torch
import torch.distributed as dist
from gloo_ranks import spawn

from archlab.config.schema import FFNConfig, ModelConfig, MoEConfig, RouterConfig


def _worker(rank: int, world: int, capacity_factor, one_sided: bool, out_dir: str) -> None:
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    import archlab.parallel.expert as ep_module
    from archlab.nn.moe import MoELayer
    from archlab.parallel.expert import enable_expert_parallel

    cfg = ModelConfig(d_model=32, ffn=FFNConfig(type="swiglu", bias=False),
                      moe=MoEConfig(num_experts=8, top_k=2, expert_hidden=16, ep_size=world,
                                    capacity_factor=capacity_factor, min_capacity=1,
                                    router=RouterConfig(type="softmax_topk")))
    torch.manual_seed(0)  # same weights on every rank
    ref = MoELayer(cfg)
    u = torch.nn.functional.normalize(torch.randn(32), dim=0)
    if one_sided:  # every token prefers experts 0-3 (rank 0's): rank 1 receives no row at all
        with torch.no_grad():
            ref.router.gate.weight[:4] += 3 * u
            ref.router.gate.weight[4:] -= 3 * u
    ep = MoELayer(cfg)
    ep.load_state_dict(ref.state_dict())
    model = torch.nn.ModuleDict({"0": ep})
    assert enable_expert_parallel(model) == 1
    torch.manual_seed(100 + rank)  # different tokens per rank, and a different count per rank
    x = torch.randn(1, 9 + 4 * rank, 32) + (3 * u if one_sided else 0)
    g = torch.randn_like(x)

    xr = x.clone().requires_grad_(True)
    y_ref, _ = ref(xr)
    y_ref.backward(g)
    exchanges = []  # (rows in, input splits, output splits) of every row exchange

    dtypes = []

    def recording(rows, output_splits, input_splits, group):
        exchanges.append((rows.shape[0], list(input_splits), list(output_splits)))
        dtypes.append(rows.dtype)
        return all_to_all(rows, output_splits, input_splits, group)

    all_to_all, ep_module.all_to_all_single_autograd = ep_module.all_to_all_single_autograd, recording
    xe = x.clone().requires_grad_(True)
    y_ep, _ = ep(xe)
    y_ep.backward(g)
    if capacity_factor is None and not one_sided:  # bf16 autocast: the rows cross in bf16, as the experts run
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y16_ref, y16_ep = ref(x)[0], ep(x)[0]
        assert dtypes[2:] == [torch.bfloat16] * 2 and y16_ep.dtype == y16_ref.dtype == torch.bfloat16
        torch.testing.assert_close(y16_ep, y16_ref)
        del exchanges[2:]
    ep_module.all_to_all_single_autograd = all_to_all

    # exactly the kept slots cross: to rank p its experts' slots, from rank p its slots for mine
    El = 8 // world
    with torch.no_grad():
        counts_E = ref.router.dispatch(ref.router(x.view(-1, 32)), x.shape[1]).counts_E
    all_counts = [torch.empty_like(counts_E) for _ in range(world)]
    dist.all_gather(all_counts, counts_E)
    sent = counts_E.view(world, El).sum(1).tolist()
    received = [int(c[rank * El:(rank + 1) * El].sum()) for c in all_counts]
    assert exchanges == [(int(counts_E.sum()), sent, received), (sum(received), received, sent)]
    if one_sided:  # rank 0 gets every slot of both ranks (9 and 13 tokens, 2 slots each), rank 1 none
        assert received == ([18, 26] if rank == 0 else [0, 0])
    torch.testing.assert_close(y_ep, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xe.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ep.router.gate.weight.grad, ref.router.gate.weight.grad, rtol=1e-5, atol=1e-6)
    # a local expert's gradient collects the tokens of every rank: the sum of the references
    for name in ("w_up", "w_down"):
        full = getattr(ref.experts, name).grad.clone()
        dist.all_reduce(full)
        torch.testing.assert_close(getattr(ep.experts, name).grad, full[rank * El:(rank + 1) * El],
                                   rtol=1e-5, atol=1e-6)
        p = getattr(ep.experts, name)
        assert not one_sided or rank == 0 or not p.grad.any()  # no row received: zero gradients, not None
        assert p.shape[0] == El and p.allreduce is False and p.group_name == f"ep_size_{world}"
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(ep.parameters()), "name": "all"})
    moe_groups = [grp for grp in groups if grp.get("moe")]
    assert len(moe_groups) == 1 and moe_groups[0]["name"] == f"ep_size_{world}"
    assert {id(p) for p in moe_groups[0]["params"]} == {id(ep.experts.w_up), id(ep.experts.w_down)}
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()


@pytest.mark.slow
@pytest.mark.parametrize("capacity_factor,one_sided", [(None, False), (0.75, False), (None, True)],
                         ids=["dropless", "capacity", "one-rank-receives-nothing"])
def test_parallel_expert_two_ranks_match_the_unsharded_layer(tmp_path, capacity_factor, one_sided):
    world = 2
    spawn(_worker, world, capacity_factor, one_sided, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ok0", "ok1"]  # both ranks ran every check


def test_parallel_expert_needs_an_initialised_process_group():
    from archlab.parallel.expert import create_groups

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        create_groups(2)


def _engine_worker(rank: int, world: int, out_dir: str) -> None:
    """One SGD step through a DeepSpeed engine (ZeRO 0) with experts sharded over both ranks
    equals one step of the unsharded model on the mean loss of both ranks' batches."""
    import deepspeed
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    from archlab import build_model
    from archlab.config.schema import NormConfig, PositionConfig
    from archlab.parallel.expert import attach_to_deepspeed_engine, enable_expert_parallel

    cfg = ModelConfig(vocab_size=64, max_seq_len=16, d_model=32, n_layers=2, n_heads=4,
                      norm=NormConfig(type="rmsnorm"), position=PositionConfig(type="rope"),
                      ffn=FFNConfig(type="swiglu", bias=False),
                      moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=16, ep_size=world))
    torch.manual_seed(0)
    ref = build_model(cfg)
    model = build_model(cfg)
    model.load_state_dict(ref.state_dict())
    enable_expert_parallel(model)
    batches = [torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(r)) for r in range(world)]

    def loss_of(m, ids):
        out = m(ids[:, :-1])
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten())

    p0 = {n: q.detach().clone() for n, q in ref.named_parameters()}
    lr = 0.5
    opt = torch.optim.SGD(split_params_into_different_moe_groups_for_optimizer(
        {"params": list(model.parameters()), "name": "all"}), lr=lr)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 0}, "gradient_clipping": 0.0, "steps_per_print": 10**9})
    attach_to_deepspeed_engine(engine, model)
    engine.backward(loss_of(engine, batches[rank]))
    engine.step()

    ref_loss = sum(loss_of(ref, b) for b in batches) / world
    ref_loss.backward()
    with torch.no_grad():
        for p in ref.parameters():
            p -= lr * p.grad
    El = 4 // world
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
        expected = p_ref[rank * El:(rank + 1) * El] if name.endswith(("w_up", "w_down")) else p_ref
        torch.testing.assert_close(p.detach(), expected.detach(), rtol=1e-4, atol=1e-6, msg=name)
        assert not torch.equal(p.detach(), p0[name][rank * El:(rank + 1) * El] if expected is not p_ref else p0[name])
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()


@pytest.mark.slow
def test_parallel_expert_deepspeed_engine_step_equals_unsharded_step(tmp_path):
    world = 2
    spawn(_engine_worker, world, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["ok0", "ok1"]
