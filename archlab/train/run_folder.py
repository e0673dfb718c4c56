"""The run folder: everything an experiment leaves behind, one folder per run.

    run.json         marks the folder as an archlab run (name, creation time)
    recipe.yaml      the resolved recipe (all defaults filled in, overrides applied)
    env.json         archlab version and git commit, library versions, device, world size,
                     precision, FLOPs per token and the peak FLOP/s that MFU is measured against
    tokenizer.json   the tokenizer the run trained with
    metrics.jsonl    one JSON object per line: train rows, validation rows (``"kind"`` says which)
    routing.jsonl    MoE models: per-layer routing records
    tb/              TensorBoard event files (when tensorboard is installed)
    checkpoints/     step_XXXXXXXX/ folders, see :mod:`archlab.train.checkpoint`
    summary.json     final numbers (written at the end, also after an interruption)
    loss.png         train and validation loss against tokens seen
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any, Optional

from archlab.io import read_jsonl, write_json_atomic, write_text_atomic  # noqa: F401  (read_jsonl re-exported)
from archlab.train.checkpoint import RUN_MARKER

METRICS = "metrics.jsonl"
ROUTING = "routing.jsonl"


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
    import archlab

    full = {"archlab_version": archlab.__version__, "git_commit": git_commit(), "python": platform.python_version(),
            "platform": platform.platform(), "versions": library_versions(), **env}
    write_json_atomic(run_dir / "env.json", full)


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
    """Appends rows to metrics.jsonl (and routing.jsonl) and mirrors scalars to TensorBoard.

    Only the main process creates one. TensorBoard is optional: without the package, nothing is
    written there and ``tensorboard_active`` is False.
    """

    def __init__(self, run_dir: Path, tensorboard: bool):
        self.run_dir = run_dir
        self._metrics = open(run_dir / METRICS, "a")
        self._routing = None
        self.tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.tb = None
            else:
                self.tb = SummaryWriter(log_dir=str(run_dir / "tb"))

    @property
    def tensorboard_active(self) -> bool:
        return self.tb is not None

    def write(self, row: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self.tb is not None:
            prefix = row.get("kind", "train")
            for k, v in row.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step",):
                    self.tb.add_scalar(f"{prefix}/{k}", v, global_step=row["step"])

    def write_routing(self, row: dict[str, Any]) -> None:
        if self._routing is None:
            self._routing = open(self.run_dir / ROUTING, "a")
        self._routing.write(json.dumps(row) + "\n")
        self._routing.flush()

    def close(self) -> None:
        self._metrics.close()
        if self._routing is not None:
            self._routing.close()
        if self.tb is not None:
            self.tb.close()


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
    if val:
        ax.plot([r["tokens"] for r in val], [r["loss"] for r in val], "o-", label="validation")
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = run_dir / "loss.png"
    tmp = run_dir / "loss.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, out)
    return out
