"""One point of a sweep (a run: what to train, for how long, what became of it) and how points are named."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Point:
    """One run of the sweep: what to train, for how long, and what became of it."""

    name: str
    ladder: str
    size: str
    recipe: str
    overrides: list  # the point's own overrides (size, grid, common); steps and folders added at launch
    budget_kind: str  # tokens | flops
    budget: float  # a cooldown branch: its D; a stable trunk: the tokens it trains (to the last branch step)
    max_steps: int = 0
    tokens_per_step: int = 0
    flops_per_token: float = 0.0
    planned_tokens: int = 0
    planned_flops: float = 0.0
    run_dir: str = ""
    status: str = "pending"  # pending | running | finished | diverged | failed | interrupted | blocked
    returncode: Optional[int] = None
    elapsed_s: Optional[float] = None
    log: str = ""
    extra: dict = field(default_factory=dict)
    # full: a whole schedule from step 0 | stable: a WSD trunk (constant lr to the end; not a scaling
    # point) | cooldown: a branch of the stable trunk ``parent``, the scaling point (N, D = its tokens)
    role: str = "full"
    parent: Optional[str] = None
    cooldown: dict = field(default_factory=dict)  # cooldown.* of the spec and the planned branch steps
    peak_rss_bytes: Optional[int] = None  # peak resident memory of the trainer process (ru_maxrss of the child)
    cell: dict = field(default_factory=dict)  # the grid's values of this point: {key: value} (as written in the spec)
    job: dict = field(default_factory=dict)  # a SLURM job's {"launcher", "id", "folder", "state"} (tools.launch)


def _budget_tag(kind: str, value: float) -> str:
    """4096 tokens -> tok4096; 2.5e13 FLOPs -> flop2.5e13 (6 significant digits)."""
    number = f"{value:.6g}".replace("e+0", "e").replace("e+", "e")
    return f"{'tok' if kind == 'tokens' else 'flop'}{number}"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
