"""Rank, world size and collective helpers for the trainer.

Rank and world size come from ``torch.distributed`` whenever it is initialised: under
``accelerate launch --use_deepspeed`` on a machine without GPUs, accelerate reports one process
although torch.distributed holds two (see REFERENCES.md, DeepSpeed section), and the data must
still be sharded and the metrics still reduced over the real group.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterator, NoReturn, Optional

import torch
import torch.distributed as dist

from archlab.errors import fail

# Imported before any process group exists, on purpose: this module's functions take
# ``group=group.WORLD`` as a default argument, evaluated at import. Imported later (DeepSpeed and
# transformers import it), each default would hold the default ProcessGroup object for the life
# of the interpreter, so that group would only be destroyed during interpreter finalization, where
# its gloo threads abort the process. Imported first, the defaults are None (= the default group).
import torch.distributed.nn.functional  # noqa: F401  isort: skip


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def dist_info(accelerator=None) -> DistInfo:
    """The real data-parallel rank and world size of this process."""
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size())
    if accelerator is not None:
        return DistInfo(accelerator.process_index, accelerator.num_processes)
    return DistInfo(0, 1)


def process_group_timeout(train_cfg) -> Optional[timedelta]:
    """``train.dist_timeout_s`` as the process-group timeout (None: torch's default); refused unless positive."""
    seconds = train_cfg.get("dist_timeout_s")
    if seconds is None:
        return None
    if not seconds > 0:
        fail("train.dist_timeout_s", seconds, "must be a positive number of seconds (or null for torch's default: "
                                              "NCCL 10 min, gloo 30 min)")
    return timedelta(seconds=float(seconds))


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _comm_device(t: torch.Tensor) -> torch.device:
    """NCCL reduces CUDA tensors only; gloo reduces CPU tensors (and CUDA ones through a copy)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return t.device


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    out = t.detach().clone()
    if not _active():
        return out
    buf = out.to(_comm_device(out))
    dist.all_reduce(buf, op=op)
    return buf.to(t.device)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over all ranks, on ``t``'s device (a copy; identity in a single process)."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of ``t`` over all ranks (a copy; identity in a single process)."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def barrier() -> None:
    if _active():
        dist.barrier()


def broadcast_object(obj, src: int = 0):
    """``obj`` of rank ``src`` on every rank (pickled in memory between our own processes only)."""
    if not _active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_objects(obj) -> list:
    """Every rank's ``obj``, in rank order (``[obj]`` in a single process; pickled between our own processes)."""
    if not _active():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


@contextlib.contextmanager
def main_process_first(info: DistInfo) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. builds a cache), the others after it finished."""
    if not info.is_main:
        barrier()
    yield
    if info.is_main:
        barrier()


def shutdown_distributed(synchronize: bool = False) -> None:
    """Tear down every process group of this rank; idempotent, a no-op in a single process.

    In order: the groups DeepSpeed created (expert-parallel, expert-data-parallel, all-to-all, its
    world clone), newest first; then the default group; then DeepSpeed's cached handles are
    dropped and the garbage collected. ``synchronize`` first waits for every rank (a barrier):
    pass it when all ranks are known to reach this point (the run finished or stopped together),
    never on an error path, where a peer may never arrive.

    A destroyed group's threads only stop when its last Python reference goes; see
    :func:`exit_process` for why a rank should not then go through interpreter finalization.
    """
    global _used_process_groups
    ds_groups = sys.modules.get("deepspeed.utils.groups")
    if dist.is_available() and dist.is_initialized():
        if synchronize and dist.get_world_size() > 1:
            dist.barrier()
        for group in reversed(_deepspeed_subgroups(ds_groups)):
            dist.destroy_process_group(group)
        dist.destroy_process_group()
        _used_process_groups = True
    if ds_groups is not None and hasattr(ds_groups, "_release_process_group_references"):
        ds_groups._release_process_group_references(None)  # DeepSpeed forgets the handles it cached
    gc.collect()


_used_process_groups = False


def exit_process(status: int) -> NoReturn:
    """End this process with ``status`` after :func:`shutdown_distributed`.

    In a process that held process groups: flush stdout and stderr, then ``os._exit(status)``,
    skipping interpreter finalization. Destroying a group does not free it while other objects
    still hold it, and some always do after a DeepSpeed run (the engine stays reachable through
    its own forward/backward hooks after ``engine.destroy()``, and with it the ZeRO optimizer and
    every parameter's ``_dp_group``). Such a group is then freed during finalization, where its
    gloo worker threads abort the process ("terminate called without an active exception",
    SIGABRT): a run that finished and wrote everything would exit by a signal, at random.
    Everything a run writes is on disk, atomically, before this point. In a single process that
    never made a group: ``sys.exit(status)``, the normal exit.
    """
    if not _used_process_groups:
        sys.exit(status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken pipe: nothing more to say
            pass
    os._exit(status)


def groups_left() -> dict:
    """What :func:`shutdown_distributed` should have left: whether torch.distributed is still
    initialised and how many groups DeepSpeed's ``groups`` module still holds (for tests)."""
    return {"initialized": bool(dist.is_available() and dist.is_initialized()),
            "deepspeed_groups": len(_deepspeed_subgroups(sys.modules.get("deepspeed.utils.groups")))}


def _deepspeed_subgroups(ds_groups) -> list:
    """The process groups DeepSpeed's ``groups`` module holds on this rank, each once, in the order
    it lists them (module globals and their name -> group tables); not the default group."""
    if ds_groups is None:
        return []
    found: list = []
    for value in vars(ds_groups).values():
        candidates = value.values() if isinstance(value, dict) else [value]
        for group in candidates:
            if (isinstance(group, dist.ProcessGroup) and group is not dist.GroupMember.WORLD
                    and all(group is not g for g in found)):
                found.append(group)
    return found


_teardown_registered = False


def teardown_at_exit() -> None:
    """Destroy this process's groups before the interpreter exits (registered once), for scripts
    that drive a :class:`~archlab.train.Trainer` themselves and forget to; the CLI tears down
    explicitly and ends by :func:`exit_process`, which scripts should do too."""
    global _teardown_registered
    if not _teardown_registered:
        atexit.register(shutdown_distributed)
        _teardown_registered = True
