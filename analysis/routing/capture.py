"""Routing decisions captured by running a model: a forward hook on each router reads the top-K expert ids
of held-out token windows; no model code is changed."""

from __future__ import annotations

import glob
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from analysis.runs import Run, RunError
from archlab.data import Tokenizer
from archlab.objectives import token_data


def moe_routers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """layer name ("layer<i>", i = decoder block index) -> that block's router module."""
    out = {}
    for i, block in enumerate(getattr(model, "blocks", [])):
        router = getattr(getattr(block, "ffn", None), "router", None)
        if getattr(block, "is_moe", False) and router is not None:
            out[f"layer{i}"] = router
    return out


@torch.no_grad()
def capture_topk(model: torch.nn.Module, windows_BS: torch.Tensor, batch_size: int = 16) -> dict[str, np.ndarray]:
    """Run the model (eval mode) over token windows; return layer -> (N, K) chosen expert ids,
    N = B*S tokens in row-major order of ``windows_BS``. A forward hook on each router reads the
    ``experts_NK`` of its output; no model code is changed."""
    routers = moe_routers(model)
    if not routers:
        raise RunError("the model has no MoE layer: routing inspection needs an MoE run")
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in routers}
    hooks = [r.register_forward_hook(lambda mod, inp, out, name=name: captured[name].append(out.experts_NK.cpu()))
             for name, r in routers.items()]
    was_training = model.training
    model.eval()
    try:
        for i in range(0, windows_BS.shape[0], batch_size):
            model(windows_BS[i:i + batch_size])
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {name: torch.cat(chunks).numpy() for name, chunks in captured.items()}


def held_out_tokens(run: Run, text_args: Sequence[str], max_tokens: int) -> tuple[np.ndarray, str]:
    """Token ids to analyse: ``--text`` (files, globs, or the text itself) through the run's tokenizer, else
    the run's own validation split. Returns (ids, description)."""
    if text_args:
        tok_path = run.path / "tokenizer.json"
        if not tok_path.is_file():
            raise RunError(f"{run.path}: tokenizer.json missing; cannot tokenise --text")
        tok = Tokenizer.load(tok_path)
        texts, source = read_texts(text_args)
        ids = []
        for text in texts:
            ids += tok.encode(text)
            if len(ids) >= max_tokens:
                break
        return np.asarray(ids[:max_tokens], dtype=np.int64), source

    data = token_data(run.recipe)
    return np.asarray(data.val[:max_tokens], dtype=np.int64), "the run's validation split"


def read_texts(text_args: Sequence[str]) -> tuple[list[str], str]:
    """The texts ``--text`` names: an existing file or a glob that matches is read (UTF-8); an argument with a
    space or a line break in it is the text itself; anything else is a missing file. Returns (texts, source)."""
    texts, files, literal = [], 0, 0
    for t in text_args:
        matches = sorted(glob.glob(t)) if glob.has_magic(t) else [t]
        if matches and all(Path(m).is_file() for m in matches):
            for m in matches:
                try:
                    texts.append(Path(m).read_text(encoding="utf-8"))
                except UnicodeDecodeError:
                    raise RunError(f"--text {m}: not UTF-8 text") from None
            files += len(matches)
        elif any(c.isspace() for c in t):
            texts.append(t)
            literal += 1
        else:
            raise RunError(f"--text {t}: no such file (a text given on the command line needs a space in it)")
    parts = ([f"{files} --text file(s)"] if files else []) + ([f"{literal} --text string(s)"] if literal else [])
    return texts, " and ".join(parts)


def to_windows(ids: np.ndarray, seq_len: int) -> torch.Tensor:
    """Non-overlapping (B, S) windows of the ids (a shorter tail is dropped)."""
    B = len(ids) // seq_len
    if B == 0:
        raise RunError(f"held-out text too short: {len(ids)} tokens, fewer than one window of seq_len={seq_len}")
    return torch.from_numpy(ids[: B * seq_len].reshape(B, seq_len).copy())


def checkpoint_step(path: Path) -> int:
    m = re.search(r"step_(\d+)", Path(path).name)
    return int(m.group(1)) if m else -1
