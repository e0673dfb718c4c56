"""Test helper (not a test module): run a function on several gloo processes, each torn down and
ended as ``python -m archlab.train`` ends.

    from gloo_ranks import spawn
    spawn(worker, 2, *args)   # worker(rank, world, *args) in each process
"""

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from archlab.train.dist import exit_process, shutdown_distributed


def spawn(fn, world: int, *args) -> None:
    """Run ``fn(rank, world, *args)`` on ``world`` processes over gloo. A worker that fails a check
    (or dies for any other reason, a signal included) fails the test."""
    mp.spawn(_rank_main, args=(fn, world, _free_port(), *args), nprocs=world, join=True)


def _rank_main(rank: int, fn, world: int, port: int, *args) -> None:
    """One rank: its process group, the work, then every group torn down and the process ended
    with the library's teardown and exit."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    finished = False
    try:
        fn(rank, world, *args)
        finished = True
    finally:
        shutdown_distributed(synchronize=finished)
    exit_process(0)  # only after the work passed; a failed check raises and spawn reports it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
