"""Training: ``python -m archlab.train <recipe.yaml> [key=value ...]`` or ``accelerate launch -m archlab.train ...``.

    from archlab.train import train
    summary = train(archlab.load_recipe("recipes/llama/tiny.yaml", ["train.max_steps=50"]))

    from archlab.train.checkpoint import load_model, latest
    model, cfg = load_model("runs/llama-tiny-20250101-120000")   # newest complete checkpoint

- ``loop``: the :class:`Trainer` (steps, evaluation, checkpoints), calling its callbacks' hooks
- ``callbacks``: the loop's optional features (non-finite policy, MoE bookkeeping, router tracing, WSD
  branching, metrics rows, trackers), chosen from the recipe once; the hooks and their order in ``callbacks.base``
- ``evaluate``, ``checkpointer``, ``record``: a Trainer's validation, checkpoint save/load, run folder and summary
- ``optim``: the optimizer (``train.optimizer``) and the lr schedule of a run; the classes are in ``archlab.optim``
- ``checkpoint``: atomic, verified checkpoints; ``load_model``, ``latest``
- ``run_folder``: what a run writes (env.json, metrics.jsonl, summary.json, loss.png...)
- ``backends``: how each launch trains (plain/DDP, DeepSpeed ZeRO, expert parallelism), one module each
- ``parallel``: accelerate / DeepSpeed wiring; ``dist``: rank, world size, reductions
"""

from archlab.train.checkpoint import CheckpointError, latest, load_model
from archlab.train.faults import NonFiniteError
from archlab.train.loop import Trainer, train

__all__ = ["CheckpointError", "NonFiniteError", "Trainer", "latest", "load_model", "train"]
