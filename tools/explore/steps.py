"""What happens between the attention maps: the residual stream, each block's norms, attention output
projection and feed-forward internals, read with forward hooks on the model's own modules (the hooks
only read tensors: the model's math is unchanged), and the logit lens.

Shape legend: S positions, D model width, F feed-forward hidden width, L blocks, V vocabulary,
K lens tokens shown per block.

``capture_steps(model)`` records, for every block of every stack, the residual stream entering and
leaving it, the input and output of its two norms, the heads' concatenation entering the attention's
output projection and that projection's output, and for a dense FFN the expansion (up-projection
output), the activation (the down-projection's input) and the projection back.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from tools.explore.encode import array

LENS_TOP = 5  # tokens per position and block in the logit lens


def _stacks(model: nn.Module) -> dict[str, nn.ModuleList]:
    """{stack key: blocks}: the keys the attention views use (``self``: the stack the head reads)."""
    out = {"self": model.blocks}
    if hasattr(model, "encoder_blocks"):
        out["encoder"] = model.encoder_blocks
    return out


@contextmanager
def capture_steps(model: nn.Module, inside: bool = True) -> Iterator[dict[tuple[str, int], dict[str, Tensor]]]:
    """{(stack, layer): {name: tensor (S, ...)}} of the batch's first row, filled while the model runs.
    ``inside=False``: the residual stream only (two hooks per block: what a new prompt's page needs)."""
    rec: dict[tuple[str, int], dict[str, Tensor]] = {}
    handles = []

    def keep(key, name, t):
        rec.setdefault(key, {})[name] = t[0].detach().float()  # fresh tensors, never written in place later

    def add(module, key, name_in=None, name_out=None):
        if module is None or isinstance(module, nn.Identity):
            return
        if name_in:
            handles.append(module.register_forward_pre_hook(lambda m, args: keep(key, name_in, args[0])))
        if name_out:
            handles.append(module.register_forward_hook(
                lambda m, args, out: keep(key, name_out, out[0] if isinstance(out, tuple) else out)))

    for stack, blocks in _stacks(model).items():
        for i, b in enumerate(blocks):
            key = (stack, i)
            add(b, key, "resid_in", "resid_out")
            if not inside:
                continue
            add(getattr(b, "attn_norm", None), key, "attn_norm_in", "attn_norm_out")
            add(getattr(b, "ffn_norm", None), key, "ffn_norm_in", "ffn_norm_out")
            add(getattr(b.attn, "wo", None), key, "concat", "attn_out")
            if not getattr(b, "is_moe", False) and hasattr(b.ffn, "up_proj"):
                add(b.ffn.up_proj, key, None, "ffn_up")
                add(b.ffn.down, key, "ffn_act", "ffn_out")
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def residual(rec: dict, stack: str, n_layers: int) -> dict:
    """The residual stream's L2 norm per position: entering block 0 (embedding + position) and after
    each block, (L + 1, S)."""
    xs = [rec[(stack, 0)]["resid_in"]] + [rec[(stack, i)]["resid_out"] for i in range(n_layers)]
    return {"norm": array(torch.stack([x.norm(dim=-1) for x in xs]))}


@torch.no_grad()
def logit_lens(model: nn.Module, rec: dict, n_layers: int, pos: int) -> dict:
    """The next-token distribution at position ``pos`` read after each block through the model's own
    final norm and head: top-K ids and probabilities (temperature 1) per block, (L, K). One position
    at a time: all of them would cost L x S x V, most of a new prompt's time."""
    x_LD = torch.stack([rec[("self", i)]["resid_out"][pos] for i in range(n_layers)])
    p_LV = model.head_logits(model.final_norm(x_LD[None]))[0].float().softmax(-1)
    top = p_LV.topk(min(LENS_TOP, p_LV.shape[-1]), dim=-1)
    return {"pos": pos, "ids": array(top.indices.to(torch.int32), "i32"), "probs": array(top.values)}


def block_steps(rec: dict, stack: str, layer: int) -> dict:
    """One block's norms, output projection and feed-forward internals (what the detail view draws)."""
    r = rec.get((stack, layer), {})
    rms = {k: array(r[k].pow(2).mean(-1).sqrt()) for k in ("attn_norm_in", "attn_norm_out", "ffn_norm_in",
                                                             "ffn_norm_out", "resid_in", "resid_out") if k in r}
    out: dict = {"rms": rms}
    if "concat" in r:
        out["concat"], out["attn_out"] = array(r["concat"]), array(r["attn_out"])
    if "ffn_up" in r:
        act = r["ffn_act"]  # (S, F)
        out["ffn"] = {"up": array(r["ffn_up"]), "act": array(act), "out": array(r["ffn_out"]),
                      "magnitude": array(act.abs().mean(0)), "hidden": act.shape[-1],
                      "gated": r["ffn_up"].shape[-1] == 2 * act.shape[-1]}
    return out
