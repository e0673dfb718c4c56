"""What a :class:`~archlab.train.loop.Trainer` writes to a checkpoint folder and reads back from it:
weights, the backend's optimizer files, RNG, and state.json (step, tokens, time, launch shape, branch).
The folder format itself (atomic writes, verification, pruning) is :mod:`archlab.train.checkpoint`'s."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from archlab.io import write_json_atomic
from archlab.train import checkpoint as ckpt
from archlab.train.dist import all_gather_objects, barrier
from archlab.version import __version__


def save_checkpoint(trainer, elapsed: float) -> Path:
    """Write a checkpoint of the current step atomically (collective: every rank calls it)."""
    run, step, info, t = trainer.run_dir, trainer.step, trainer.info, trainer.cfg.train
    if info.is_main:
        ckpt.begin(run, step)
    barrier()
    tmp = ckpt.tmp_dir(run, step)
    ckpt.save_rng(tmp, info.rank)
    weights = trainer.backend.save(tmp, trainer.model)  # its optimizer files; the full weights for rank 0
    if info.is_main:
        ckpt.save_model_weights(weights, tmp / ckpt.WEIGHTS)
        write_json_atomic(tmp / ckpt.STATE, {
            "step": step, "tokens": trainer.tokens, "elapsed_s": elapsed, "world_size": info.world_size,
            "global_batch": t.micro_batch_size * t.grad_accum * info.world_size,
            **trainer.backend.checkpoint_fields(),  # deepspeed, zero_stage, ep_size
            "archlab_version": __version__,
            "branch": trainer.branch})
        ckpt.save_recipe(trainer.cfg, tmp / ckpt.RECIPE)
    barrier()
    # every rank hashes its share of the files (by size), rank 0 writes the manifest from them all
    hashes = {name: entry for share in all_gather_objects(ckpt.hash_share(tmp, info.rank, info.world_size))
              for name, entry in share.items()}
    final = ckpt.tmp_dir(run, step).with_name(ckpt.step_dir_name(step))
    if info.is_main:
        ckpt.finish(run, step, t.keep_last, keep_steps=t.ckpt_steps, hashes=hashes)
    barrier()
    return final


def load_checkpoint(trainer, ckpt_dir: Path) -> tuple[dict, Optional[Path]]:
    """Load weights, step, tokens and time into ``trainer``; return the state.json and ``ckpt_dir`` when the
    backend restores its optimizer state from it as well, None when that restarts (another ep_size: a warning)."""
    state = ckpt.load_state(ckpt_dir)
    ckpt.load_weights_into(trainer.model, ckpt_dir)
    restarts = trainer.backend.check_resume(ckpt_dir, state)
    if restarts is not None:
        trainer.log(f"warning: {restarts}")
    trainer.step, trainer.tokens = int(state["step"]), int(state["tokens"])
    trainer.elapsed_before = float(state.get("elapsed_s", 0.0))
    t = trainer.cfg.train
    batch_now = t.micro_batch_size * t.grad_accum * trainer.info.world_size
    if state.get("global_batch") not in (None, batch_now):
        trainer.log(f"warning: checkpoint was trained with a global batch of {state['global_batch']} windows, "
                    f"this launch uses {batch_now}: the data order differs from an uninterrupted run")
    saved_world = state.get("world_size")
    if saved_world is not None and int(saved_world) != trainer.info.world_size:  # the backend allowed it
        trainer.log(other_world_size_note(int(saved_world), trainer.info.world_size, state.get("global_batch"),
                                          batch_now, optimizer_restored=restarts is None))
    return state, None if restarts is not None else ckpt_dir


def other_world_size_note(saved: int, now: int, batch_before: Optional[int], batch_now: int,
                          optimizer_restored: bool = True) -> str:
    """What a resume by another number of processes keeps: the data order (by the global batch) and the RNG."""
    if batch_before in (None, batch_now):
        data = (f"the global batch is unchanged ({batch_now} windows), so every step reads the windows the "
                "uninterrupted run reads, split over the processes and micro batches differently (losses agree "
                "to rounding)")
    else:
        data = "the global batch changed, so the data order differs from an uninterrupted run"
    missing = ", ".join(str(r) for r in range(saved, now))
    rng = f"; rank {missing}: no RNG state in the checkpoint, its dropout RNG starts from the seed" if missing else ""
    restored = ("weights and optimizer state restored (the same on every process)" if optimizer_restored
                else "weights restored (the optimizer state restarts, see the warning)")
    return f"note: checkpoint was written by {processes(saved)}, this run has {now}: {restored}; {data}{rng}"


def processes(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"
