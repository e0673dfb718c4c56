"""The router trace of a run (``train.router_trace_every``, off by default): every n optimizer
steps, for a fixed number of sampled tokens, what every MoE layer's router decided.

    router_trace/index.json            what the files hold: shape legend, layers, E, K, T, sampling
    router_trace/steps.jsonl           one line per traced step: step, file, seconds, skipped
    router_trace/step_XXXXXXXX.npz     the arrays of one traced step (numpy .npz, uncompressed)

Shape legend: T traced tokens, L MoE layers, K experts per token, E experts, B micro-batch, S sequence.

Arrays of one step (``numpy.load``; ``analysis.routing.read_trace`` stacks every step):

    token_index  int64 (T,)       row n = b*S + s of the flattened (B, S) input of the micro-batch
    token_id     int64 (T,)       the input token id at that row
    experts      int16 (T, L, K)  the chosen experts, in top-k order (after the selection bias and
                                  group limiting: what the layer used)
    weights      fp32  (T, L, K)  their gate weights as applied to the expert outputs
    dropped      bool  (T, L, K)  slots capacity dropped (all False when dropless)
    logits       fp32  (T, L, E)  raw router logits (before softmax / sigmoid)
    expert_bias  fp32  (L, E)     aux-loss-free selection bias at that forward (only runs that use it)

Which tokens: T = min(``TRACE_TOKENS``, B*S) rows of the first micro-batch of the traced step on
the main process (rank 0), drawn without replacement by a generator seeded from ``train.seed``
and the step, sorted: the same rows for the same seed and step, whatever else the run does.
"Step t" is the forward of the optimizer step whose metrics row has ``"step": t``.

Cost: off, one flag test per MoE forward. On, per traced step: four row gathers per layer in
the forward, one copy of T*L*(E + 3K) numbers to the host, one small file and one appended line
(no fsync; index.json is written once per launch). Each line of steps.jsonl records
``seconds``, the host time spent collecting and writing that step's trace;
``python -m tools.bench_router_trace`` measures the whole overhead, tracing on against off in
one process.

A resumed run traces its steps again (the same rows and, on the CPU, the same values): at start
it cuts steps.jsonl back to its checkpoint's step, and a file is replaced when its step is traced
again. A branch (``train.branch_from``) starts a new folder and traces from its branch step.
Only the main process writes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from archlab.io import write_json_atomic
from archlab.train.run_folder import truncate_jsonl

TRACE_DIR = "router_trace"
INDEX = "index.json"
STEPS = "steps.jsonl"
FORMAT = "archlab-router-trace"
VERSION = 1
TRACE_TOKENS = 64  # traced tokens per traced step (fewer when the micro-batch holds fewer)

LEGEND = {
    "token_index": "int64 (T,): row n = b*S + s of the flattened (B, S) input of the first micro-batch",
    "token_id": "int64 (T,): the input token id at that row",
    "experts": "int16 (T, L, K): chosen expert ids in top-k order (after selection bias and group limiting)",
    "weights": "float32 (T, L, K): gate weights of those experts as applied (renormalised, route-scaled)",
    "dropped": "bool (T, L, K): slot dropped by capacity (always False when dropless)",
    "logits": "float32 (T, L, E): raw router logits (before softmax / sigmoid)",
    "expert_bias": "float32 (L, E): aux-loss-free selection bias (only runs that use it)",
}


def step_file(step: int) -> str:
    return f"step_{step:08d}.npz"


def sample_tokens(n_tokens: int, step: int, seed: int, count: int = TRACE_TOKENS) -> Tensor:
    """int64 (T,), T = min(count, n_tokens): sorted distinct rows of a batch of ``n_tokens``,
    a function of (seed, step) only."""
    g = torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) % (2 ** 63))
    return torch.randperm(n_tokens, generator=g)[:min(count, n_tokens)].sort().values


class RouterTracer:
    """Decides which steps are traced and writes their files (main process only)."""

    def __init__(self, run_dir: Path, every: int, seed: int, tokens: int = TRACE_TOKENS):
        if every < 0:
            raise ValueError(f"train.router_trace_every={every}: must be >= 0 (0 = off)")
        self.dir = Path(run_dir) / TRACE_DIR
        self.every, self.seed, self.tokens = int(every), int(seed), int(tokens)
        self._index_written = False

    def start(self, step: int) -> None:
        """Before the first step of a launch that starts at ``step`` (0, or a resumed checkpoint's):
        steps.jsonl keeps only the lines of steps up to it."""
        truncate_jsonl(self.dir / STEPS, step)

    def due(self, step: int) -> bool:
        """Whether the optimizer step that ends at ``step`` is traced."""
        return self.every > 0 and step % self.every == 0

    def sample(self, step: int, n_tokens: int) -> Tensor:
        return sample_tokens(n_tokens, step, self.seed, self.tokens)

    def write(self, step: int, trace: dict, token_ids: Tensor, seq_len: int, seconds: float = 0.0,
              skipped: bool = False) -> Path:
        """Write one traced step (``trace`` from :func:`archlab.nn.moe.take_trace`, ``token_ids`` the
        (T,) input ids of the traced rows) and its line of steps.jsonl; returns the .npz path.
        ``seconds``: host time already spent collecting it (the write's own time is added);
        ``skipped``: the step's batch was skipped (non-finite loss), the weights not updated."""
        t0 = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        E = int(trace["logits"].shape[-1])
        arrays = {
            "token_index": trace["token_index"].numpy().astype(np.int64),
            "token_id": token_ids.cpu().numpy().astype(np.int64),
            "experts": trace["experts"].numpy().astype(np.int16 if E <= np.iinfo(np.int16).max else np.int32),
            "weights": trace["weights"].numpy().astype(np.float32),
            "dropped": trace["dropped"].numpy().astype(bool),
            "logits": trace["logits"].numpy().astype(np.float32),
        }
        if "expert_bias" in trace:
            arrays["expert_bias"] = trace["expert_bias"].numpy().astype(np.float32)
        path = self.dir / step_file(step)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
        if not self._index_written:  # once per launch: nothing in it changes during a run
            T, L, K = arrays["experts"].shape
            write_json_atomic(self.dir / INDEX, {
                "format": FORMAT, "version": VERSION, "legend": LEGEND, "layers": list(trace["layers"]),
                "num_experts": E, "top_k": int(K), "tokens_per_step": int(T), "seq_len": int(seq_len),
                "every": self.every, "seed": self.seed, "steps_file": STEPS,
                "sampling": "T rows of the first micro-batch on rank 0, drawn without replacement by a generator "
                            "seeded from train.seed and the step, sorted"})
            self._index_written = True
        line = {"step": int(step), "file": path.name, "skipped": bool(skipped),
                "seconds": float(seconds + time.perf_counter() - t0)}
        with open(self.dir / STEPS, "a") as f:
            f.write(json.dumps(line) + "\n")
        return path


def tracer_for(run_dir: Path, train_cfg, is_main: bool, is_moe: bool) -> Optional[RouterTracer]:
    """The run's tracer: None when ``train.router_trace_every`` is 0, on other ranks than the
    main one, or for a model without MoE layers."""
    every = int(train_cfg.get("router_trace_every", 0) or 0)  # >= 0: the recipe's validation refuses less
    if every == 0 or not is_main or not is_moe:
        return None
    return RouterTracer(run_dir, every, int(train_cfg.seed))
