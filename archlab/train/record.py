"""The run folder as a :class:`~archlab.train.loop.Trainer` keeps it: which folder and checkpoint (decided
on rank 0), what is written at start (recipe, tokenizer, logs cut back to a resumed step, env.json) and
the summary at the end (summary.json, loss.png). The file formats are :mod:`archlab.train.run_folder`'s."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import torch

from archlab.config.validate import RecipeError
from archlab.io import write_json_atomic
from archlab.model import num_params
from archlab.train import checkpoint as ckpt
from archlab.train.dist import broadcast_object
from archlab.train.parallel import resolve_precision
from archlab.train.run_folder import (
    METRICS,
    RESUME_CHANGES,
    ROUTING,
    SUMMARY,
    TOKENIZER,
    check_resume_changes,
    mark_run,
    plot_losses,
    read_jsonl,
    resolve_run,
    run_role,
    truncate_jsonl,
    write_env,
)


def resolve(cfg, info) -> tuple[Path, Optional[Path], list[str], list[dict[str, Any]]]:
    """(run folder, checkpoint to resume from or None, messages, accepted resume changes), decided on rank 0."""
    result: Any = None
    if info.is_main:
        try:
            run, found, notes = resolve_run(cfg)
            changes = []
            if found is not None and Path(found).resolve().parent.parent == run.resolve():  # not a new branch
                # train.resume_allow_changes: the differences accepted; without it a difference is refused
                changes = check_resume_changes(cfg, found, info.world_size)
            if changes:
                notes = [*notes, "resume: train.resume_allow_changes=true: continuing with changed train "
                         "settings: " + "; ".join(f"{c['key']} {c['checkpoint']!r} -> {c['run']!r}"
                                                  for c in changes)]
            result = ("ok", run, found, notes, changes)
        except (RecipeError, ckpt.CheckpointError) as e:
            result = ("error", type(e).__name__, str(e))
    result = broadcast_object(result)
    if result[0] == "error":
        raise (ckpt.CheckpointError if result[1] == "CheckpointError" else RecipeError)(result[2])
    return result[1], result[2], result[3], result[4]


def start_run_folder(trainer, resume_from: Optional[Path], resumes_here: bool) -> None:
    """Main process: mark the folder, write recipe and tokenizer, cut a resumed run's logs back to its
    step (recording accepted changes), let the callbacks add theirs (``on_run_folder``), write env.json."""
    run, cfg, step = trainer.run_dir, trainer.cfg, trainer.step
    mark_run(run, cfg.name)
    ckpt.save_recipe(cfg, run / ckpt.RECIPE)
    trainer.data.tokenizer.save(run / TOKENIZER)
    if resumes_here:
        truncate_jsonl(run / METRICS, step)
        truncate_jsonl(run / ROUTING, step)
        truncate_jsonl(run / RESUME_CHANGES, step - 1)  # a resume at this step again replaces its row
        if trainer.resume_changes:  # accepted under train.resume_allow_changes: recorded with the run
            with open(run / RESUME_CHANGES, "a") as f:
                f.write(json.dumps({"step": step, "checkpoint": str(resume_from), "time": time.time(),
                                    "changes": trainer.resume_changes}) + "\n")
    for cb in trainer.callbacks:
        cb.on_run_folder(trainer, resume_from)
    branch = trainer.branch or {}
    write_env(run, {
        "device": str(trainer.device),
        "device_name": torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda" else "cpu",
        "world_size": trainer.info.world_size,
        "accelerate_distributed_type": str(trainer.accelerator.distributed_type),
        "accelerate_num_processes": trainer.accelerator.num_processes,
        **trainer.backend.describe(),  # backend, deepspeed_config
        "mixed_precision": resolve_precision(cfg.train.precision),
        "torch_threads": torch.get_num_threads(),
        "n_params": num_params(cfg),
        "flops_per_token": trainer.flops_per_token,
        "flops_per_token_source": trainer.flops_source,
        "peak_flops": trainer.peak_flops,
        "peak_flops_source": trainer.peak_source,
        "mfu_definition": "tokens/s * flops_per_token / (peak_flops * world_size)",
        "tokens_per_step": trainer.tokens_per_step,
        "warmup_capped_from": cfg.train.warmup_capped_from,  # the recipe's warmup, longer than the run
        "data_cache": str(trainer.data.cache_path),
        "data_meta": trainer.data.meta,
        "unigram_entropy_train": trainer.unigram_entropy,
        "resumed_from": str(resume_from) if resume_from else None,
        "resume_changes": trainer.resume_changes,  # the train settings this launch changed (resume_allow_changes)
        "branch_from": branch.get("from"),
        "branch_step": branch.get("step"),
    })


def role(trainer) -> dict[str, Any]:
    """What kind of scaling point the run is. ``role``: ``stable`` (constant lr to the end, e.g. the
    trunk of WSD cooldowns: its final loss is not that of a finished schedule), ``cooldown`` (a
    decaying run branched from another run's checkpoint: it stands for a run of ``tokens`` tokens,
    the parent's included) or ``full`` (a whole schedule from step 0)."""
    branch = trainer.branch or {}
    return {"role": run_role(trainer.cfg.train, branched=bool(trainer.branch)), "branch_from": branch.get("from"),
            "branch_step": branch.get("step")}


def summarize(trainer, status: str, message: str, elapsed: float) -> dict[str, Any]:
    """The run's summary; on the main process also written to summary.json with loss.png beside it."""
    run = trainer.run_dir
    summary: dict[str, Any] = {"status": status, "message": message, "step": trainer.step, "tokens": trainer.tokens,
                               "run_dir": str(run), **role(trainer),
                               "last_checkpoint": str(trainer.last_ckpt) if trainer.last_ckpt else None,
                               "elapsed_s": elapsed, "rank": trainer.info.rank}
    if not trainer.info.is_main:
        return summary
    rows = read_jsonl(run / METRICS)
    train = [r for r in rows if r.get("kind") == "train"]
    final_val = [r for r in rows if r.get("kind") == "val" and r.get("final")]
    key = trainer.objective.eval_loss_key
    summary.update({
        "final_train_loss": train[-1]["loss"] if train else None,
        # the causal next-token loss only (comparable across runs): {} for another objective, whose own loss
        # (masked LM: mlm_loss; span corruption: span_loss) is final_val_<val_loss_key>
        "val_loss_key": key,
        "final_val_loss": {str(r["context_len"]): r.get("loss") for r in final_val if "loss" in r},
        **({f"final_val_{key}": {str(r["context_len"]): r[key] for r in final_val if key in r}}
           if key != "loss" and any(key in r for r in final_val) else {}),
        "final_val_skipped": {str(r["context_len"]): r["skipped"] for r in final_val if "skipped" in r},
        "unigram_entropy_train": trainer.unigram_entropy,
        "mean_tokens_per_s": (sum(r["tokens_per_s"] for r in train) / len(train)) if train else None,
        "mean_mfu": (sum(r["mfu"] for r in train) / len(train)) if train else None,
        "flops_per_token": trainer.flops_per_token,
        "training_flops": trainer.flops_per_token * trainer.tokens,
        "n_params": num_params(trainer.cfg),
        # every resume that changed train settings (train.resume_allow_changes), oldest first
        "resume_changes": read_jsonl(run / RESUME_CHANGES) if (run / RESUME_CHANGES).is_file() else [],
    })
    try:
        write_json_atomic(run / SUMMARY, summary)
        if train:
            plot_losses(run, trainer.cfg.name)
    finally:
        if trainer.metrics is not None:
            trainer.metrics.close()
    return summary
