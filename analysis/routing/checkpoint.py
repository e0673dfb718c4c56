"""What a checkpoint's router learned: specialisation, top tokens, co-activation and saturation over
held-out text, and MaxVio of a run's final weights on its validation split."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from analysis.routing.capture import capture_topk, checkpoint_step, held_out_tokens, to_windows
from analysis.routing.health import routed_load
from analysis.routing.stats import coactivation, maxvio_of_choices, saturation, specialisation, top_tokens
from analysis.runs import Run, RunError
from archlab.data import Tokenizer
from archlab.nn.moe.stats import STARVED_FRACTION
from archlab.objectives import token_data
from archlab.train.checkpoint import CheckpointError, load_model, resolve_checkpoint


def held_out_maxvio(run_dir, max_tokens: int = 32768) -> dict:
    """MaxVio of a run's final weights on its own validation split, as Wang et al. (2024) report it (at the
    end of training, on held-out data): per MoE layer ``global`` and ``batch`` (batches of the run's
    global batch in tokens), and their means over layers."""
    model, cfg = load_model(run_dir)
    t = cfg.train
    S = int(t.seq_len)
    ids = np.asarray(token_data(cfg).val[:max_tokens], dtype=np.int64)
    topk = capture_topk(model, to_windows(ids, S))
    E = int(cfg.model.moe.num_experts)
    batch_tokens = int(t.micro_batch_size) * int(t.grad_accum) * S
    layers = {layer: maxvio_of_choices(e_NK, E, batch_tokens) for layer, e_NK in topk.items()}
    return {"layers": layers, "tokens": int(len(ids) // S * S), "batch_tokens": batch_tokens,
            "global": float(np.mean([v["global"] for v in layers.values()])),
            "batch": float(np.mean([v["batch"] for v in layers.values()]))}


def _resolve_ckpt(run: Run, spec: Optional[str]) -> Path:

    try:
        return resolve_checkpoint(spec if spec else run.path)
    except CheckpointError as e:
        raise RunError(str(e)) from None


def inspect_checkpoint(run: Run, ckpt: Path, compare: Sequence[Path], text: Sequence[str], max_tokens: int,
                       min_count: int, starved_fraction: float = STARVED_FRACTION) -> dict:
    """Specialisation, top tokens, co-activation, load per expert (dead and starved experts) and saturation
    from a checkpoint, over ``text`` (``--text``) or the run's validation split."""

    try:
        model, cfg = load_model(ckpt)
    except CheckpointError as e:
        raise RunError(str(e)) from None
    ids, source = held_out_tokens(run, text, max_tokens)
    S = min(int(cfg.train.seq_len), max(1, len(ids)))
    tokens_N = ids if text else to_windows(ids, S).reshape(-1).numpy()  # a given text: every token, its tail too
    topk = route(model, tokens_N, S)
    E = int(cfg.model.moe.num_experts)
    decode = _decoder(run)
    spec = {layer: specialisation(tokens_N, e_NK, E, min_count) for layer, e_NK in topk.items()}
    coact = {layer: coactivation(e_NK, E) for layer, e_NK in topk.items()}
    load = {layer: routed_load(e_NK, E, starved_fraction) for layer, e_NK in topk.items()}
    sat = {}
    for other in compare:
        try:
            m2, _ = load_model(other)
        except CheckpointError as e:
            raise RunError(str(e)) from None
        t2 = route(m2, tokens_N, S)
        sat[checkpoint_step(other)] = {layer: saturation(t2[layer], topk[layer]) for layer in topk}
    return {"checkpoint": str(ckpt), "step": checkpoint_step(ckpt), "tokens": int(len(tokens_N)), "source": source,
            "spec": spec, "coact": coact, "load": load, "saturation": sat,
            "top_k": int(next(iter(topk.values())).shape[1]),
            "top_tokens": {layer: top_tokens(spec[layer], decode, min_count=min_count) for layer in spec}}


def route(model, ids_N: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    """layer -> (N, K) chosen experts of every id of ``ids_N``: windows of ``seq_len``, then the shorter tail as one
    window of its own."""
    windows = to_windows(ids_N, seq_len)
    topk = capture_topk(model, windows)
    tail = ids_N[windows.numel():]
    if len(tail):
        rest = capture_topk(model, torch.from_numpy(np.ascontiguousarray(tail)).view(1, -1))
        topk = {layer: np.concatenate([e_NK, rest[layer]]) for layer, e_NK in topk.items()}
    return topk


def _decoder(run: Run):
    tok_path = run.path / "tokenizer.json"
    if tok_path.is_file():
        tok = Tokenizer.load(tok_path)
        return lambda i: tok.decode([i])
    return lambda i: f"<{i}>"
