"""nanoGPT-style GPT, reimplemented after karpathy/nanoGPT model.py: a benchmark peer.

nanoGPT is what a user would pick instead of archlab's GPT, but no package ships it, and
``tools.bench`` runs without network; so this is a minimal, faithful copy of its model code
(commit 3adf61e, Nov 2025), with one change: the MLP's GELU is tanh-approximated (as GPT-2's
original and archlab's ``ffn.type: gelu``) instead of nanoGPT's exact ``nn.GELU()``, so that the
same weights give the same loss. Kept as nanoGPT has them: one ``c_attn`` projection split into
q, k, v; ``F.scaled_dot_product_attention(is_causal=True)``; a LayerNorm with an optional bias;
a 4x GELU MLP; the LM head tied to ``wte``; ``F.cross_entropy`` over the full (B, S, V) logits.
Left out: generation, checkpoint loading, the optimizer helper (the benchmark builds AdamW).

:func:`from_archlab` copies the weights of an archlab dense GPT (``recipes/dense/*``).

Shape legend: B batch, S sequence, D model dim (n_embd), H heads, Dh head dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True  # True: bias in Linears and LayerNorms, like GPT-2


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (eps 1e-5)."""

    def __init__(self, ndim: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)  # q, k, v of all heads
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x_BSD: Tensor) -> Tensor:
        B, S, D = x_BSD.size()
        q, k, v = self.c_attn(x_BSD).split(self.n_embd, dim=2)
        k = k.view(B, S, self.n_head, D // self.n_head).transpose(1, 2)  # (B, H, S, Dh)
        q = q.view(B, S, self.n_head, D // self.n_head).transpose(1, 2)
        v = v.view(B, S, self.n_head, D // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=self.dropout if self.training else 0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, S, D)  # heads side by side
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # nanoGPT: nn.GELU() (exact); see the module docstring
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx_BS: Tensor, targets_BS: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        """(logits (B, S, V), mean cross-entropy or None); without targets, the last position's
        logits only (B, 1, V), as nanoGPT."""
        B, S = idx_BS.size()
        if S > self.config.block_size:
            raise ValueError(f"cannot forward a sequence of length {S}: block_size is {self.config.block_size}")
        pos = torch.arange(0, S, dtype=torch.long, device=idx_BS.device)
        x = self.transformer.drop(self.transformer.wte(idx_BS) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets_BS is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets_BS.view(-1), ignore_index=-1)
            return logits, loss
        return self.lm_head(x[:, [-1], :]), None


def from_archlab(model: nn.Module) -> GPT:
    """A nanoGPT-style GPT with the weights of an archlab dense GPT (LayerNorm, learned positions,
    GELU MLP, multi-head attention, tied embeddings, pre-LN, standard parametrisation); anything
    else is refused with the recipe key that differs."""
    cfg = model.cfg
    checks = {
        "attention.type": (cfg.attention.type, "mha"),
        "norm.type": (cfg.norm.type, "layernorm"),
        "norm.placement": (cfg.norm.placement, "pre"),
        "norm.eps": (cfg.norm.eps, 1e-5),
        "position.type": (cfg.position.type, "learned"),
        "ffn.type": (cfg.ffn.type, "gelu"),
        "ffn_hidden": (cfg.ffn_hidden, 4 * cfg.d_model),
        "kv_heads": (cfg.kv_heads, cfg.n_heads),
        "tie_embeddings": (cfg.tie_embeddings, True),
        "attention.qk_norm": (cfg.attention.qk_norm, False),
        "attention.bias == ffn.bias == norm.bias": (
            (cfg.attention.bias, cfg.ffn.bias, getattr(cfg.norm, "bias", False)), (cfg.attention.bias,) * 3),
        "attention scale (1/sqrt(d_head); no muP)": (model.blocks[0].attn.scale, 1 / math.sqrt(cfg.d_head)),
        "readout multiplier (no muP)": (model.readout_mult, 1.0),
        "dropout, attention.dropout, ffn.dropout": ((cfg.dropout, cfg.attention.dropout, cfg.ffn.dropout),
                                                    (0.0, 0.0, 0.0)),
    }
    for key, (got, want) in checks.items():
        if got != want:
            raise ValueError(f"nanoGPT-style GPT needs {key} = {want}, the archlab model has {got}")
    gpt = GPT(GPTConfig(block_size=cfg.max_seq_len, vocab_size=cfg.vocab_size, n_layer=cfg.n_layers,
                        n_head=cfg.n_heads, n_embd=cfg.d_model, dropout=0.0, bias=cfg.attention.bias))
    pairs = [("transformer.wte", model.embed), ("transformer.wpe", model.positions.table),
             ("transformer.ln_f", model.final_norm)]
    for i, blk in enumerate(model.blocks):
        p = f"transformer.h.{i}"
        pairs += [(f"{p}.ln_1", blk.attn_norm), (f"{p}.attn.c_attn", blk.attn.wqkv),  # rows [q; k; v], head-major
                  (f"{p}.attn.c_proj", blk.attn.wo), (f"{p}.ln_2", blk.ffn_norm),
                  (f"{p}.mlp.c_fc", blk.ffn.up), (f"{p}.mlp.c_proj", blk.ffn.down)]
    ours = dict(gpt.named_modules())
    with torch.no_grad():
        for name, src in pairs:
            for attr in ("weight", "bias"):
                if getattr(ours[name], attr, None) is not None:
                    getattr(ours[name], attr).copy_(getattr(src, attr))
    return gpt
