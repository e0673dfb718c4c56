"""The run folder: everything an experiment leaves behind, one folder per run.

    run.json         marks the folder as an archlab run (name, creation time)
    recipe.yaml      the resolved recipe (all defaults filled in, overrides applied)
    env.json         archlab version and git commit, library versions, device, world size,
                     precision, FLOPs per token and the peak FLOP/s that MFU is measured against
    tokenizer.json   the tokenizer the run trained with
    metrics.jsonl    one JSON object per line: train rows, validation rows (``"kind"`` says which)
    routing.jsonl    MoE models: per-layer routing records
    router_trace/    MoE models with train.router_trace_every: sampled routing decisions (archlab/train/router_trace.py)
    tb/              TensorBoard event files (train.trackers: [tensorboard]); wandb/ with wandb
    checkpoints/     step_XXXXXXXX/ folders, see :mod:`archlab.train.checkpoint`
    resume_changes.jsonl  one row per resume that changed train settings under train.resume_allow_changes
                     (step, checkpoint, each key's checkpoint and new value); listed in summary.json too
    summary.json     final numbers (written at the end, also after an interruption)
    loss.png         train and validation loss against tokens seen
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from archlab.checkpoints import TOKENIZER  # noqa: F401  (a run folder file, named with the checkpoints)
from archlab.config.load import nest_objective
from archlab.config.schema import TrainConfig
from archlab.config.validate import RecipeError
from archlab.io import read_jsonl, write_json_atomic, write_text_atomic  # noqa: F401  (read_jsonl re-exported)
from archlab.optim import schedule_class
from archlab.train import checkpoint as ckpt
from archlab.train.checkpoint import RECIPE, RUN_MARKER  # noqa: F401  (the run's names, all here)
from archlab.train.optim import lr_at
from archlab.version import __version__

# the files of a run folder, named once (analysis/ and tools/ import them from here)
METRICS = "metrics.jsonl"
ROUTING = "routing.jsonl"
SUMMARY = "summary.json"
ENV = "env.json"
LOSS_PLOT = "loss.png"
RESUME_CHANGES = "resume_changes.jsonl"

# train keys a resume may change without changing the run's trajectory: where the run writes, what and
# how often it logs, evaluates and checkpoints, how the same step is computed (torch.compile, activation
# recomputation: same gradients) and how a non-finite step is handled. Every other train key (steps,
# schedule, lr, warmup, decay, optimizer and its settings, objective, seq_len, clipping, precision, seed)
# is checked against the checkpoint's recipe (:func:`check_resume_changes`). micro_batch_size and
# grad_accum are checked as the global batch they make with the number of processes: the step's windows
# depend only on (seed, step, global batch), so another split of the same batch continues the run exactly.
RESUME_FREE = frozenset({
    "resume", "resume_allow_changes", "branch_from", "out_dir", "run_name",
    "log_every", "eval_every", "eval_batches", "eval_context_multipliers", "ckpt_every", "ckpt_steps", "keep_last",
    "trackers", "tracker_project", "tensorboard", "routing_every", "router_trace_every", "peak_flops",
    "compile", "activation_checkpointing", "on_nonfinite", "micro_batch_size", "grad_accum", "dist_timeout_s",
    "warmup_capped_from",  # a record of the recipe's warmup before the cap; warmup_steps itself is checked
})
GLOBAL_BATCH = "global batch (train.micro_batch_size x train.grad_accum x processes)"


def run_role(train_cfg, branched: bool) -> str:
    """What kind of scaling point a run is (``role`` in summary.json and the sweep manifest):
    ``stable`` (constant lr to the end, e.g. a WSD trunk: not a scaling point), ``cooldown`` (a
    decaying branch of another run's checkpoint) or ``full`` (a whole schedule from step 0)."""
    if not schedule_class(train_cfg).decays:
        return "stable"
    return "cooldown" if branched else "full"


def default_run_name(recipe_name: str) -> str:
    return f"{recipe_name}-{time.strftime('%Y%m%d-%H%M%S')}"


def mark_run(run_dir: Path, name: str) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / RUN_MARKER).is_file():
        write_json_atomic(run_dir / RUN_MARKER, {"archlab_run": 1, "name": name, "created": time.time()})


def git_commit() -> Optional[str]:
    """The commit of the archlab checkout this code runs from (None outside a git checkout)."""
    repo = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def library_versions() -> dict[str, Optional[str]]:
    from importlib import metadata

    versions = {}
    for pkg in ("torch", "deepspeed", "accelerate", "transformers", "tokenizers", "safetensors", "omegaconf"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def write_env(run_dir: Path, env: dict[str, Any]) -> None:
    full = {"archlab_version": __version__, "git_commit": git_commit(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": library_versions(), **env}
    write_json_atomic(run_dir / ENV, full)


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Keep only rows with ``step <= max_step`` (a resumed run re-logs the steps after its checkpoint)."""
    if not path.is_file():
        return
    kept = [r for r in read_jsonl(path) if r.get("step", 0) <= max_step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))


def copy_jsonl_rows(src: Path, dst: Path, max_step: int) -> None:
    """A branch's log starts as its parent's: ``dst`` becomes the rows of ``src`` with ``step <= max_step``,
    end-of-run (``final``) evaluations left out. Nothing is written when ``src`` does not exist."""
    dst.unlink(missing_ok=True)
    if not src.is_file():
        return
    kept = [r for r in read_jsonl(src) if r.get("step", 0) <= max_step and not r.get("final")]
    write_text_atomic(dst, "".join(json.dumps(r) + "\n" for r in kept))


class MetricsLog:
    """Appends rows to metrics.jsonl (and routing.jsonl), the run's record (the trackers get their copy
    from :class:`archlab.train.callbacks.Trackers`). Only the main process creates one."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._metrics = open(run_dir / METRICS, "a")
        self._routing = None

    def write(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()

    def write_routing(self, row: dict[str, Any]) -> None:
        if self._routing is None:
            self._routing = open(self.run_dir / ROUTING, "a")
        self._routing.write(json.dumps(row) + "\n")
        self._routing.flush()

    def close(self) -> None:
        """Close the files; idempotent."""
        self._metrics.close()
        if self._routing is not None:
            self._routing.close()


def plot_losses(run_dir: Path, title: str) -> Path:
    """loss.png: train loss (and validation loss) against tokens seen, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(run_dir / METRICS)
    train = [r for r in rows if r.get("kind") == "train"]
    val = [r for r in rows if r.get("kind") == "val" and r.get("context_multiplier", 1) == 1]
    fig, ax = plt.subplots(figsize=(6, 4))
    # loss_avg: mean over the steps since the previous row, smoother than the single-step loss
    ax.plot([r["tokens"] for r in train], [r.get("loss_avg", r["loss"]) for r in train], label="train", lw=1)
    for key, label in (("loss", "validation"), ("mlm_loss", "validation (masked tokens)"),
                       ("span_loss", "validation (masked spans)")):
        points = [r for r in val if key in r]
        if points:
            ax.plot([r["tokens"] for r in points], [r[key] for r in points], "o-", label=label)
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = run_dir / LOSS_PLOT
    tmp = run_dir / "loss.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out


# --------------------------------------------------------------------------------------------
# where a run writes, and what it continues from
# --------------------------------------------------------------------------------------------


def resolve_run(cfg: DictConfig) -> tuple[Path, Optional[Path], list[str]]:
    """Where this run writes, and which checkpoint (if any) it continues from.

    - ``resume: none``: a new folder ``out_dir/run_name`` (default ``<recipe name>-<timestamp>``);
      an existing run there is an error (it would be overwritten).
    - ``resume: auto``: the folder ``out_dir/run_name``, or without run_name the newest run of this
      recipe under out_dir; continue from its newest complete checkpoint, falling back past
      corrupt ones (and saying so); start fresh when there is none.
    - ``resume: <path>``: a checkpoint folder (must be complete) or a run folder (as auto);
      the run continues in that checkpoint's run folder.
    - ``branch_from: <checkpoint>`` (with resume none or auto): see :func:`resolve_branch`.
    """
    t = cfg.train
    if t.branch_from is not None:
        return resolve_branch(cfg)
    out = Path(t.out_dir)
    notes: list[str] = []
    if t.resume == "none":
        run = out / (t.run_name or default_run_name(cfg.name))
        if ckpt.is_run_dir(run) and (ckpt.checkpoints(run) or (run / METRICS).is_file()):
            raise RecipeError(f"train.run_name={run.name!r}: {run} already holds a run; continue it with "
                              "train.resume=auto or choose another train.run_name")
        return run, None, notes
    if t.resume == "auto":
        run = out / t.run_name if t.run_name else _newest_run(out, cfg.name)
        if run is None or not ckpt.is_run_dir(run):
            run = run or out / default_run_name(cfg.name)
            return run, None, notes + [f"resume=auto: no earlier run found, starting {run}"]
        found, problems = ckpt.latest_valid(run)
        notes += [f"resume=auto: skipping a corrupt checkpoint: {p}; falling back to the previous one"
                  for p in problems]
        if found is None:
            return run, None, notes + [f"resume=auto: {run} holds no complete checkpoint, starting from step 0"]
        return run, found, notes
    path = Path(t.resume)
    if not path.exists():
        raise RecipeError(f"train.resume={t.resume!r}: no such checkpoint or run folder (use none, auto or a path)")
    if ckpt.is_run_dir(path):
        found, problems = ckpt.latest_valid(path)
        notes += [f"resume: skipping a corrupt checkpoint: {p}; falling back to the previous one" for p in problems]
        if found is None:
            raise ckpt.CheckpointError(f"train.resume={t.resume!r}: the run holds no complete checkpoint")
        return path, found, notes
    if not ckpt.is_checkpoint_dir(path) or not ckpt.is_run_dir(path.parent.parent):
        raise ckpt.CheckpointError(f"train.resume={t.resume!r}: not an archlab run folder ({ckpt.RUN_MARKER} missing) "
                                   "nor a checkpoint folder of one (<run>/checkpoints/step_XXXXXXXX)")
    ckpt.verify(path)
    return path.parent.parent, path, notes


def resolve_branch(cfg: DictConfig) -> tuple[Path, Path, list[str]]:
    """``train.branch_from``: a NEW run folder ``out_dir/run_name`` that starts from another run's
    checkpoint (weights, optimizer state, step, tokens, RNG), so that it continues that run's data
    stream and, where the schedules agree before the branch step, its exact trajectory: the
    cooldown branches of a WSD trunk (Hägele et al. 2024).

    - ``resume: none``: the folder must not hold a run yet;
    - ``resume: auto`` (needs ``run_name``): the folder's newest complete checkpoint when it has one
      (a branch that was interrupted continues), else the branch starts from ``branch_from``.

    Refused: a checkpoint that is not complete or not an archlab run's (CheckpointError), a model
    recipe that differs from the checkpoint's, a folder branched from another checkpoint
    (RecipeError). A different data stream or learning rate before the branch step is a warning.
    """
    t = cfg.train
    if t.resume == "auto" and not t.run_name:
        raise RecipeError(f"train.branch_from={t.branch_from!r} with train.resume=auto needs train.run_name "
                          "(the branch's own run folder; the newest run of the recipe may be its parent)")
    run = Path(t.out_dir) / (t.run_name or default_run_name(cfg.name))
    notes: list[str] = []
    if ckpt.is_run_dir(run) and t.resume == "auto":
        _check_same_parent(run, t.branch_from)
        found, problems = ckpt.latest_valid(run)
        notes += [f"resume=auto: skipping a corrupt checkpoint: {p}; falling back to the previous one"
                  for p in problems]
        if found is not None:
            return run, found, notes
        notes.append(f"resume=auto: {run} holds no complete checkpoint; branching from train.branch_from")
    elif ckpt.is_run_dir(run) and (ckpt.checkpoints(run) or (run / METRICS).is_file()):
        raise RecipeError(f"train.run_name={run.name!r}: {run} already holds a run; continue the branch with "
                          "train.resume=auto or choose another train.run_name")
    source = Path(t.branch_from)
    if not source.is_dir():
        raise ckpt.CheckpointError(f"train.branch_from={t.branch_from!r}: no such checkpoint folder (list the "
                                   "branch steps in the parent's train.ckpt_steps so that keep_last spares them)")
    if not ckpt.is_checkpoint_dir(source) or not ckpt.is_run_dir(source.parent.parent):
        raise ckpt.CheckpointError(f"train.branch_from={t.branch_from!r}: not a checkpoint folder of an archlab run "
                                   "(<run>/checkpoints/step_XXXXXXXX)")
    ckpt.verify(source)
    return run, source, notes + _check_branch_source(cfg, source)


def _check_same_parent(run: Path, branch_from: str) -> None:
    """A branch folder continued with resume=auto must have been branched from the same checkpoint."""
    recipe = run / ckpt.RECIPE
    if not recipe.is_file():
        return
    before = OmegaConf.load(recipe).get("train", {}).get("branch_from")
    if before is None or Path(before).resolve() != Path(branch_from).resolve():
        raise RecipeError(f"train.branch_from={branch_from!r}: {run} was started "
                          + (f"from {before!r}" if before else "as a run of its own, not a branch")
                          + "; use another train.run_name")


def _check_branch_source(cfg: DictConfig, source: Path) -> list[str]:
    """RecipeError when the checkpoint's model differs (``moe.ep_size`` aside: a launch setting the
    loader handles); warnings when the data stream or the learning rate before the branch step
    differ (the branch then does not continue its parent)."""
    parent = ckpt.load_recipe_of(source)
    diffs = [d for d in _differences(OmegaConf.to_container(parent.model), OmegaConf.to_container(cfg.model), "model")
             if not d.startswith("model.moe.ep_size:")]
    if diffs:
        raise RecipeError(f"train.branch_from={cfg.train.branch_from!r}: the checkpoint's model recipe differs from "
                          f"this run's ({'; '.join(diffs[:5])}); a branch continues the same model")
    notes = []
    keys = ("seed", "seq_len", "micro_batch_size", "grad_accum")
    # where the caches live changes no token
    data_a, data_b = ({k: v for k, v in OmegaConf.to_container(c.data).items() if k != "cache_dir"}
                      for c in (parent, cfg))
    diffs = _differences(data_a, data_b, "data")
    diffs += [f"train.{k}: checkpoint {parent.train[k]!r}, branch {cfg.train[k]!r}" for k in keys
              if parent.train[k] != cfg.train[k]]
    if diffs:
        notes.append(f"warning: train.branch_from: {'; '.join(diffs[:5])}: the branch does not continue the "
                     "checkpoint's data stream")
    step = int(ckpt.load_state(source)["step"])
    differ = next((k for k in range(step) if not math.isclose(lr_at(k, parent.train), lr_at(k, cfg.train),
                                                              rel_tol=1e-9)), None)
    if differ is not None:
        notes.append(f"warning: train.branch_from: the branch's learning rate differs from the checkpoint's run at "
                     f"step {differ} < {step} (branch {lr_at(differ, cfg.train):.4g}, parent "
                     f"{lr_at(differ, parent.train):.4g}): the branch is not a cooldown of that run")
    return notes


def _differences(a: Any, b: Any, prefix: str) -> list[str]:
    """``key: checkpoint X, branch Y`` for every leaf where two nested containers differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in _differences(a.get(k), b.get(k), f"{prefix}.{k}")]
    return [] if a == b else [f"{prefix}: checkpoint {a!r}, branch {b!r}"]


def _train_leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of every leaf of a (plain) train node."""
    out: dict[str, Any] = {}
    for k, v in (node or {}).items():
        if isinstance(v, dict):
            out.update(_train_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def resume_changes(cfg: DictConfig, ckpt_dir: Path, world_size: int = 1) -> list[dict[str, Any]]:
    """The train settings in which this run differs from the checkpoint it resumes:
    ``[{"key": "train.max_steps", "checkpoint": 200, "run": 80}, ...]``, every key of the schema except
    :data:`RESUME_FREE`, compared with the checkpoint's recipe.yaml (a key that recipe lacks, written by an
    older archlab, counts at its schema default), and the global batch compared with state.json's."""
    defaults = _train_leaves(OmegaConf.to_container(OmegaConf.structured(TrainConfig)))
    saved_recipe = OmegaConf.load(ckpt_dir / ckpt.RECIPE)
    nest_objective(saved_recipe, str(ckpt_dir / ckpt.RECIPE))  # one saved before train.objective was a node
    saved_node = saved_recipe.get("train")
    saved = _train_leaves(OmegaConf.to_container(saved_node, resolve=True) if saved_node is not None else {})
    now = _train_leaves(OmegaConf.to_container(cfg.train, resolve=True))
    changes = []
    for key in sorted(now):
        if key.split(".")[0] in RESUME_FREE:
            continue
        before = saved.get(key, defaults.get(key))
        if before != now[key]:
            changes.append({"key": f"train.{key}", "checkpoint": before, "run": now[key]})
    t = cfg.train
    batch_before = ckpt.load_state(ckpt_dir).get("global_batch")
    batch_now = t.micro_batch_size * t.grad_accum * world_size
    if batch_before is not None and batch_before != batch_now:
        changes.append({"key": GLOBAL_BATCH, "checkpoint": batch_before, "run": batch_now})
    return changes


def check_resume_changes(cfg: DictConfig, ckpt_dir: Path, world_size: int = 1) -> list[dict[str, Any]]:
    """Refuse (RecipeError) a resume whose train settings differ from its checkpoint's, naming each
    difference (old -> new), unless ``train.resume_allow_changes``: then return the differences for the run
    to record. Without a recipe in the checkpoint there is nothing to compare: no differences."""
    if not (Path(ckpt_dir) / ckpt.RECIPE).is_file():
        return []
    changes = resume_changes(cfg, Path(ckpt_dir), world_size)
    if changes and not cfg.train.resume_allow_changes:
        listed = "; ".join(f"{c['key']} {c['checkpoint']!r} -> {c['run']!r}" for c in changes)
        raise RecipeError(f"train.resume={cfg.train.resume!r}: this run's train settings differ from those its "
                          f"checkpoint {ckpt_dir} was trained with ({listed}); resume with the checkpoint's values, "
                          "or set train.resume_allow_changes=true to continue with these (the run records the "
                          "changes), or start another run (train.run_name) or a branch (train.branch_from)")
    return changes


def _newest_run(out: Path, name: str) -> Optional[Path]:
    if not out.is_dir():
        return None
    runs = sorted(p for p in out.glob(f"{name}-*") if ckpt.is_run_dir(p))
    return runs[-1] if runs else None
