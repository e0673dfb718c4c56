"""Expert parallelism over 2 gloo processes: the sharded layer computes what the unsharded one
does (outputs, input/router gradients, and expert gradients summed over ranks), and its expert
parameters land in DeepSpeed's MoE optimizer groups."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from archlab.config.schema import FFNConfig, ModelConfig, MoEConfig, RouterConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, capacity_factor, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer

    from archlab.nn.moe import MoELayer
    from archlab.parallel.expert import enable_expert_parallel

    cfg = ModelConfig(d_model=32, ffn=FFNConfig(type="swiglu", bias=False),
                      moe=MoEConfig(num_experts=8, top_k=2, expert_hidden=16, ep_size=world,
                                    capacity_factor=capacity_factor, min_capacity=1,
                                    router=RouterConfig(type="softmax_topk")))
    torch.manual_seed(0)  # same weights on every rank
    ref = MoELayer(cfg)
    ep = MoELayer(cfg)
    ep.load_state_dict(ref.state_dict())
    model = torch.nn.ModuleDict({"0": ep})
    assert enable_expert_parallel(model) == 1
    torch.manual_seed(100 + rank)  # different tokens per rank, and a different count per rank
    x = torch.randn(1, 9 + 4 * rank, 32)
    g = torch.randn_like(x)

    xr = x.clone().requires_grad_(True)
    y_ref, _ = ref(xr)
    y_ref.backward(g)
    xe = x.clone().requires_grad_(True)
    y_ep, _ = ep(xe)
    y_ep.backward(g)

    torch.testing.assert_close(y_ep, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(xe.grad, xr.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ep.router.gate.weight.grad, ref.router.gate.weight.grad, rtol=1e-5, atol=1e-6)
    # a local expert's gradient collects the tokens of every rank: the sum of the references
    for name in ("w_up", "w_down"):
        full = getattr(ref.experts, name).grad.clone()
        dist.all_reduce(full)
        El = 8 // world
        torch.testing.assert_close(getattr(ep.experts, name).grad, full[rank * El:(rank + 1) * El],
                                   rtol=1e-5, atol=1e-6)
        p = getattr(ep.experts, name)
        assert p.shape[0] == El and p.allreduce is False and p.group_name == f"ep_size_{world}"
    groups = split_params_into_different_moe_groups_for_optimizer({"params": list(ep.parameters()), "name": "all"})
    moe_groups = [grp for grp in groups if grp.get("moe")]
    assert len(moe_groups) == 1 and moe_groups[0]["name"] == f"ep_size_{world}"
    assert {id(p) for p in moe_groups[0]["params"]} == {id(ep.experts.w_up), id(ep.experts.w_down)}
    open(os.path.join(out_dir, f"ok{rank}"), "w").close()
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("capacity_factor", [None, 0.75])
def test_parallel_expert_two_ranks_match_the_unsharded_layer(tmp_path, capacity_factor):
    world = 2
    mp.spawn(_worker, args=(world, _free_port(), capacity_factor, str(tmp_path)), nprocs=world, join=True)
    assert sorted(os.listdir(tmp_path)) == ["ok0", "ok1"]  # both ranks ran every check


def test_parallel_expert_needs_an_initialised_process_group():
    from archlab.parallel.expert import create_groups

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="torch.distributed"):
        create_groups(2)
