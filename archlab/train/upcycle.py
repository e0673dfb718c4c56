"""Start a causal LM from another run's weights (``train.init_from``), and sparse upcycling: a dense run's
weights turned into this recipe's MoE (``train.upcycle``).

Shape legend: D model dim, F dense FFN hidden = expert hidden, U = u*F the up-projection's width (SwiGLU: u = 2,
[gate; up]), E experts.

- no ``train.upcycle``: the run's tensors are loaded by name, every one present with its shape (a dense run
  continued with a fresh optimizer at step 0);
- ``method: copy`` (Komatsuzaki et al. 2022, "Sparse Upcycling"; Megatron-Core ``--moe-use-upcycling``): every
  non-FFN tensor copied; in each MoE layer every expert a copy of that layer's dense FFN
  (``w_up[e] = gate_up.weight^T`` (D, U), ``w_down[e] = down.weight^T`` (F, D)); dense layers of the MoE
  (``moe.first_k_dense``, ``moe.every``) keep their FFN; the router is new, drawn as the MoE recipe draws it
  (N(0, ``model.init_std``)). With top-k routing whose gate weights sum to 1 per token (softmax renormalised
  over the K chosen) and no capacity dropping, every token's output is sum_k g_k FFN(x) = FFN(x): the upcycled
  model's logits equal the dense model's at step 0;
- ``method: drop`` (Drop-Upcycling, Nakamura et al. 2025): copy, then in each expert a random set S_e of
  ``round(drop_ratio * F)`` hidden units (drawn per expert, shared by its three projections) re-initialised:
  the gate and up columns and the down rows of S_e drawn from N(mu, sigma^2), mu and sigma the mean and standard
  deviation of that dense matrix. The other hidden units stay the dense ones, so the step-0 logits differ from
  the dense model's by the re-initialised units' contribution only (0 at ``drop_ratio`` 0).

Refused by name before training: an init_from run that is not dense, whose model differs from this recipe's in
anything but ``moe`` (widths, layers, vocabulary...), an expert width other than the dense FFN's, FFN biases (the
experts have none), and shared experts (their init is not defined by either method).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from torch import Tensor, nn

from archlab.checkpoints import RECIPE, WEIGHTS, CheckpointError, resolve_checkpoint
from archlab.errors import fail
from archlab.model.classifier import load_pretrained, stored_tensors
from archlab.nn.ffn import FFNS

KEY = "train.init_from"
MODEL_LEVEL_MOE = ("moe",)  # the only model key an upcycled MoE may differ in from its dense run


def start_from(model: nn.Module, cfg: Any, log: Callable[[str], None] = print) -> None:
    """Load ``train.init_from`` into ``model`` (a causal LM): by name, or upcycled (``train.upcycle``)."""
    t = cfg.train
    if t.init_from is None or t.objective.type != "causal_lm":  # classify loads its own trunk
        return
    ckpt = checkpoint_of(t.init_from)
    if t.upcycle is None:
        load_pretrained(model, ckpt / WEIGHTS)
        log(f"init_from: weights of {ckpt} (fresh optimizer, step 0)")
        return
    dense_model = dense_model_node(ckpt, cfg.model)
    upcycle(model, load_file(str(ckpt / WEIGHTS)), cfg.model, dense_model, t.upcycle.method,
            float(t.upcycle.drop_ratio))
    log(f"init_from: {ckpt} upcycled ({t.upcycle.method}"
        + (f", drop_ratio {t.upcycle.drop_ratio}" if t.upcycle.method == "drop" else "")
        + "); routers new, N(0, model.init_std)")


def checkpoint_of(init_from: str) -> Path:
    """The checkpoint folder ``train.init_from`` names (a run folder: its newest complete one)."""
    try:
        return resolve_checkpoint(str(init_from))
    except CheckpointError as e:
        fail(KEY, init_from, f"not a run folder or checkpoint ({e})")


def dense_model_node(ckpt: Path, moe_model: Any) -> dict:
    """The init_from run's model node, checked against this MoE recipe's: dense, the same in every key but
    ``moe``, an expert as wide as its FFN, no FFN bias, no shared experts."""
    path = ckpt / RECIPE
    if not path.is_file():
        path = ckpt.parent.parent / RECIPE
    dense = OmegaConf.to_container(OmegaConf.load(path).model, resolve=True)
    mine = OmegaConf.to_container(moe_model, resolve=True) if not isinstance(moe_model, dict) else moe_model
    if dense.get("moe") is not None:
        fail(KEY, str(ckpt), "upcycling starts from a dense run; this one is an MoE (model.moe is set): "
             "give a dense run's folder")
    differ = [k for k in sorted(set(dense) | set(mine)) if k not in MODEL_LEVEL_MOE and dense.get(k) != mine.get(k)]
    if differ:
        shown = ", ".join(f"model.{k}: {dense.get(k)!r} there, {mine.get(k)!r} here" for k in differ[:4])
        fail(KEY, str(ckpt), f"its model differs from this recipe's outside model.moe ({shown}): give the MoE "
             "recipe the dense run's model settings")
    moe = mine["moe"]
    if moe.get("n_shared_experts", 0):
        fail("model.moe.n_shared_experts", moe["n_shared_experts"], "upcycling defines routed experts only "
             "(each a copy of the dense FFN): set 0")
    if dense["ffn"].get("bias"):
        fail("model.ffn.bias", True, "the experts have no biases: upcycle a dense run trained with ffn.bias=false")
    return dense


def upcycle(model: nn.Module, dense_SD: dict[str, Tensor], moe_cfg: Any, dense_model: dict, method: str,
            drop_ratio: float = 0.5) -> None:
    """Fill ``model`` (the MoE) from the dense state dict ``dense_SD``: non-FFN tensors by name, each MoE
    layer's experts from the layer's dense FFN (``method`` copy | drop), routers left as built."""
    own = stored_tensors(model)
    ffn_cls = FFNS.get(moe_cfg.ffn.type)
    hidden_F = dense_hidden(dense_SD, ffn_cls.up_name)
    if int(moe_cfg.moe.expert_hidden) != hidden_F:
        fail("model.moe.expert_hidden", moe_cfg.moe.expert_hidden, f"upcycling copies the dense FFN into every "
             f"expert: set it to the dense run's FFN width {hidden_F}")
    used: set[str] = set()
    with torch.no_grad():
        for name, t in own.items():
            if ".ffn.experts." in name:
                prefix = name.split(".experts.")[0]
                up_DU, down_FD = _dense_ffn(dense_SD, prefix, ffn_cls.up_name, used)
                t.copy_((up_DU if name.endswith("w_up") else down_FD).to(t.dtype).expand_as(t))
            elif ".ffn.router." in name:
                continue  # new router: the MoE recipe's init
            elif name in dense_SD and dense_SD[name].shape == t.shape:
                t.copy_(dense_SD[name].to(t.dtype))
                used.add(name)
            else:
                fail(KEY, name, "this MoE tensor has no dense counterpart of its shape in the init_from run")
        left = sorted(set(dense_SD) - used)
        if left:
            fail(KEY, left[0], f"dense tensors not used by the MoE ({len(left)}: {', '.join(left[:4])}): the "
                 "models do not match")
        if method == "drop":
            for module in model.modules():
                if hasattr(module, "experts") and hasattr(module.experts, "w_up"):
                    drop_reinit(module.experts.w_up, module.experts.w_down, ffn_cls.up_width, drop_ratio)


def dense_hidden(dense_SD: dict[str, Tensor], up_name: str) -> int:
    """F: the dense FFN's hidden width, read off its down projection (D, F)."""
    downs = [v for k, v in dense_SD.items() if k.endswith(".ffn.down.weight")]
    if not downs:
        fail(KEY, up_name, "no dense FFN (blocks.*.ffn.down.weight) in the init_from run")
    return int(downs[0].shape[1])


def _dense_ffn(dense_SD: dict[str, Tensor], prefix: str, up_name: str, used: set[str]) -> tuple[Tensor, Tensor]:
    """The dense FFN of layer ``prefix`` as an expert stores it: up (D, U) and down (F, D)."""
    up, down = f"{prefix}.{up_name}.weight", f"{prefix}.down.weight"
    if up not in dense_SD or down not in dense_SD:
        fail(KEY, prefix, f"the init_from run has no dense FFN here ({up}, {down}): is it the same depth?")
    used.update((up, down))
    return dense_SD[up].t(), dense_SD[down].t()


def drop_reinit(w_up_EDU: Tensor, w_down_EFD: Tensor, up_width: int, drop_ratio: float,
                generator: Optional[torch.Generator] = None) -> list[Tensor]:
    """Drop-Upcycling's re-initialisation, in place: per expert e a random set S_e of round(r * F) hidden units;
    their up columns (each of the ``up_width`` blocks of U: SwiGLU's gate and up) and down rows drawn from
    N(mu, sigma^2) of that matrix before the drop (all experts are copies, so expert 0's statistics are the
    dense matrix's). Returns the index sets S_e."""
    E, F = w_down_EFD.shape[0], w_down_EFD.shape[1]
    n_drop = int(round(drop_ratio * F))
    stats = [_block_stats(w_up_EDU[0, :, b * F:(b + 1) * F]) for b in range(up_width)]
    down_mu, down_sigma = _block_stats(w_down_EFD[0])
    sets = []
    for e in range(E):
        S = torch.randperm(F, generator=generator)[:n_drop]
        for b, (mu, sigma) in enumerate(stats):
            cols = S + b * F
            w_up_EDU[e][:, cols] = torch.randn(w_up_EDU.shape[1], n_drop, generator=generator).to(w_up_EDU.dtype) \
                * sigma + mu
        w_down_EFD[e][S, :] = torch.randn(n_drop, w_down_EFD.shape[2], generator=generator).to(w_down_EFD.dtype) \
            * down_sigma + down_mu
        sets.append(S)
    return sets


def _block_stats(w: Tensor) -> tuple[float, float]:
    """(mean, standard deviation) of a weight matrix."""
    w = w.float()
    return float(w.mean()), float(w.std()) if w.numel() > 1 else math.nan
