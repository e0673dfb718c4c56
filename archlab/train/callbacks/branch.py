"""WSD branching (``train.branch_from``): a run that starts in a new folder from another run's
checkpoint, e.g. a cooldown branch of a WSD trunk (Hägele et al. 2024).

The branch records where it came from (``trainer.branch``: the parent checkpoint and the branch step,
written to its checkpoints, env.json and summary; a resumed branch reads it back from its own
checkpoint), and its logs start as its parent's rows up to the branch step, end-of-run evaluations
left out. Chosen when ``train.branch_from`` is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from archlab.train.callbacks.base import Callback, Trainer
from archlab.train.run_folder import METRICS, ROUTING, copy_jsonl_rows


def starts_branch(trainer: Trainer, ckpt_dir: Optional[Path]) -> bool:
    """Whether ``ckpt_dir`` belongs to another run folder: this run branches from it now."""
    return ckpt_dir is not None and Path(ckpt_dir).resolve().parent.parent != trainer.run_dir.resolve()


class Branch(Callback):
    def on_restore(self, trainer: Trainer, ckpt_dir: Path, state: dict[str, Any]) -> None:
        if starts_branch(trainer, ckpt_dir):
            trainer.branch = {"from": str(ckpt_dir), "step": trainer.step}
            trainer.log(f"branching from {ckpt_dir} (step {trainer.step}, {trainer.tokens} tokens) "
                        f"into {trainer.run_dir}")
        else:
            trainer.branch = state.get("branch")

    def on_run_folder(self, trainer: Trainer, resume_from: Optional[Path]) -> None:
        if starts_branch(trainer, resume_from):
            for name in (METRICS, ROUTING):
                copy_jsonl_rows(resume_from.parent.parent / name, trainer.run_dir / name, trainer.step)
