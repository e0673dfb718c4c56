"""Two real processes (torch.distributed over gloo) read different shards of each global batch,
and together read exactly what one process with twice the accumulation steps reads."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from archlab.data import TokenBatches, prepare_data

pytestmark = pytest.mark.slow  # two spawned processes importing torch: about 10 s here

SEQ_LEN, MICRO_BATCH, GRAD_ACCUM, SEED = 32, 3, 2, 7
STEPS = (0, 1, 5)


def rank_main(rank: int, world_size: int, init_file: str, recipe_yaml: str, out_file: str) -> None:
    """One data-parallel rank: prepare the data (rank 0 first), draw batches, gather them on rank 0."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    cfg = OmegaConf.create(recipe_yaml)
    if rank != 0:
        dist.barrier()  # as accelerator.main_process_first(): rank 0 builds, the others reuse
    data = prepare_data(cfg)
    if rank == 0:
        dist.barrier()
    batches = TokenBatches(data.train, SEQ_LEN, MICRO_BATCH, GRAD_ACCUM,
                           rank=dist.get_rank(), world_size=dist.get_world_size(), seed=SEED)
    mine = torch.stack([torch.stack([batches.get(s, m) for m in range(GRAD_ACCUM)]) for s in STEPS])
    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)  # (steps, A, B, S+1) from every rank
    paths: list = [None] * world_size
    dist.all_gather_object(paths, str(data.cache_path))
    if rank == 0:
        torch.save({"batches": gathered, "cache_paths": paths, "world_size": dist.get_world_size()}, out_file)
    dist.destroy_process_group()


def test_two_ranks_read_disjoint_shards_of_the_one_process_batch(text_recipe, tmp_path):
    cfg = text_recipe()
    out_file = tmp_path / "gathered.pt"
    mp.spawn(rank_main, args=(2, str(tmp_path / "init"), OmegaConf.to_yaml(cfg), str(out_file)), nprocs=2)
    result = torch.load(out_file)
    assert result["world_size"] == 2
    rank0, rank1 = result["batches"]
    assert result["cache_paths"][0] == result["cache_paths"][1]
    caches = [p for p in text_recipe.cache.iterdir() if not p.name.endswith(".lock")]  # beside it: the build lock
    assert len(caches) == 1  # built once, by rank 0

    data = prepare_data(cfg)
    single = TokenBatches(data.train, SEQ_LEN, MICRO_BATCH, 2 * GRAD_ACCUM, rank=0, world_size=1, seed=SEED)
    for i, step in enumerate(STEPS):
        starts = [set(), set()]
        for m in range(GRAD_ACCUM):
            for r, ranked in enumerate((rank0, rank1)):
                assert torch.equal(ranked[i, m], single.get(step, m * 2 + r))
                starts[r] |= set(single.starts(step, m * 2 + r).tolist())
        assert starts[0].isdisjoint(starts[1])
        assert not torch.equal(rank0[i], rank1[i])
