"""Memory from the config alone: model states under ZeRO, activations saved for backward, KV cache.

Shape legend: B batch, S sequence, N = B*S tokens, D model dim, H query heads, G key/value heads,
Dh head dim, F ffn hidden dim, E routed experts, K experts per token, V vocabulary, L layers.

Model states (REFERENCES.md, "Transformer Math 101"): AdamW keeps 16 bytes per parameter either
way, split differently: fp32 = 4 weights + 4 grads + 8 (m, v); bf16 mixed precision = 2 bf16
weights + 2 bf16 grads + 12 (fp32 master copy, m, v). ZeRO stage 1 shards the optimizer states
over the data-parallel ranks, stage 2 also the gradients, stage 3 also the weights. Routed
experts are first split over the ``ep`` expert-parallel ranks (E/ep experts each), and their
states shard over the expert-data-parallel group of ``dp/ep`` ranks.

Activations: the bytes autograd keeps between forward and backward, derived tensor by tensor
from archlab's own modules (what each op saves; views of one storage count once; a branch of the
graph whose output dies in the forward, e.g. a top-k only its indices are taken from, frees what
it saved and counts nothing):

- norm: LayerNorm keeps its input + mean, rstd per token; RMSNorm keeps an fp32 copy of its
  input, rstd and the normalised x*rstd on CPU (composite), input + rstd on CUDA (fused);
- attention: the input of the fused QKV projection and what SDPA keeps. The fused kernels
  (CPU flash; CUDA flash / memory-efficient) keep q, k, v (after RoPE; G key/value heads, read
  through SDPA's ``enable_gqa`` without copies), the output and the log-sum-exp (fp32, one per
  head and token); CUDA also keeps an additive mask (ALiBi: one (H, S, S) tensor per layer).
  CPU runs the math kernel, in fp32, for a mask (ALiBi) or attention dropout: copies of q, k, v,
  the (B, H, S, S) probabilities (+ mask and dropped probabilities with dropout) and a copy of
  the output for the projection;
- FFN: the up-projection input and the hidden activations: GELU keeps 2F per token (its input
  and output), ReLU F (its output serves both), SwiGLU 4F ([gate; up], silu(gate), product);
- MoE: the router's fp32 input copy, scores, chosen ids and gates (+ what the balancing terms
  keep; group-limited routing keeps nothing), the tokens' rows in expert-major order, the
  experts' hidden activations and outputs per routed slot, the shared experts. This is the
  packed (grouped GEMM) layout, N*K rows; the padded (E, C) grid the experts may choose on CPU
  keeps E*C rows (C = the largest expert load);
- dropout (p > 0): one mask per dropout, in the activation dtype on CPU, bool on CUDA;
- model level: the token window (int64; the trainer reads (B, S+1) ids, the inputs and targets
  are views of it and the embedding keeps the whole window), learned position ids, RoPE cos/sin
  tables (fp32, shared by all layers), the final norm, and the LM head + loss by ``loss``:
  ``fused`` (default: what the trainer runs, ``archlab.nn.loss.linear_cross_entropy``) keeps the
  gradients wrt its input h (N x D) and the head's weight (V x D), computed in the forward, and
  the count of counted tokens; ``logits`` (the reference ``archlab.nn.loss.lm_loss`` on the
  model's (B, S, V) logits) keeps the head's input h, the N x V fp32 log-softmax (the logits are
  upcast), a copy of the targets and the loss's total weight.

Dtypes: ``bf16`` describes a model held in bf16 (DeepSpeed's bf16 mode, the 2 + 2 + 12 split
above); torch.autocast over fp32 weights (accelerate's native mixed precision) keeps more: a bf16
copy of every weight, fp32 norm outputs and residual stream, bf16 copies of the linear inputs
(measured 1.35-1.5x the ``bf16`` estimate for the tiny recipes at batch 2 x 64 on CPU); it is
not modelled here.

Activation checkpointing (``checkpointing``, the trainer's ``train.activation_checkpointing``;
``archlab.model.checkpointing`` implements it):

- ``full``: a block keeps only its input (N x D); RoPE tables then live only inside the
  recomputed blocks (nothing saves them);
- ``selective``: a block keeps its input and the outputs of its matmuls and attention kernels:
  the fused QKV projection, SDPA's output and log-sum-exp (the CPU math kernel: its two bmm
  outputs, the (B*H, S, S) scores and the weighted values, fp32), the output projection, the FFN's
  up and down projections; MoE: the router's gate logits (fp32), the experts' up and down
  grouped GEMMs over their slots, the shared experts' projections.

Either way backward recomputes one block at a time, which then holds its full activations again:
``recompute_peak`` = the largest layer's activations beyond what it kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from archlab.config.schema import ModelConfig, ffn_hidden
from archlab.costs.params import param_counts

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
# AdamW bytes per parameter: (weights, gradients, optimizer states)
PRECISIONS = {"fp32": (4, 4, 8), "bf16": (2, 2, 12)}
DEVICES = ("cpu", "cuda")
STATS_BYTES = 4  # norm statistics and attention log-sum-exp stay fp32
ID_BYTES = 8  # int64 token ids

# hidden activations an FFN of each type keeps, per token, in units of F
FFN_HIDDEN_SAVED = {"gelu": 2, "relu": 1, "swiglu": 4}
# width of an FFN's up-projection output in units of F (SwiGLU: [gate; up] in one GEMM)
FFN_UP_WIDTH = {"gelu": 1, "relu": 1, "swiglu": 2}
CHECKPOINTING = ("none", "full", "selective")  # archlab.model.checkpointing.MODES
LOSSES = ("fused", "logits")


def _check_choice(name: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"{name}={value!r}: must be one of {', '.join(map(str, valid))}")


def _check_positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or v <= 0:
            raise ValueError(f"{name}={v!r}: must be a positive integer")


# ----------------------------------------------------------------------------- model states


@dataclass(frozen=True)
class ModelStateMemory:
    """Bytes one rank holds for weights, gradients and AdamW states."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer}


def model_state_memory(model_cfg, precision: str = "bf16", zero_stage: int = 0, dp: int = 1,
                       ep: int | None = None) -> ModelStateMemory:
    """Per-rank bytes of the model states of AdamW training.

    precision: ``fp32`` or ``bf16`` (mixed: bf16 weights/grads, fp32 master + moments).
    zero_stage: 0 (none) .. 3; dp: data-parallel ranks; ep: expert-parallel ranks (default the
    recipe's ``moe.ep_size``; must divide dp and the number of experts).
    """
    from archlab.config.load import model_config

    cfg = model_config(model_cfg)
    _check_choice("precision", precision, list(PRECISIONS))
    _check_choice("zero_stage", zero_stage, [0, 1, 2, 3])
    ep = ep if ep is not None else (cfg.moe.ep_size if cfg.moe is not None else 1)
    _check_positive(dp=dp, ep=ep)
    if dp % ep:
        raise ValueError(f"ep={ep}: the expert-parallel size must divide the data-parallel size dp={dp}")
    if ep > 1 and cfg.moe is None:
        raise ValueError(f"ep={ep}: expert parallelism needs an MoE model (model.moe is not set)")
    if cfg.moe is not None and cfg.moe.num_experts % ep:
        raise ValueError(f"ep={ep}: must divide the number of experts ({cfg.moe.num_experts})")
    counts = param_counts(cfg)
    local_experts = counts.routed_experts / ep
    edp = dp // ep  # ranks holding the same experts

    def per_rank(sharded: bool) -> float:
        return counts.dense / dp + local_experts / edp if sharded else counts.dense + local_experts

    w, g, o = PRECISIONS[precision]
    return ModelStateMemory(weights=w * per_rank(zero_stage >= 3), grads=g * per_rank(zero_stage >= 2),
                            optimizer=o * per_rank(zero_stage >= 1))


# ----------------------------------------------------------------------------- KV cache


def kv_cache_bytes(model_cfg, batch: int, context: int, dtype: str = "bf16") -> float:
    """Inference KV cache: 2 (K and V) * L * G * Dh * context * batch * bytes per element."""
    from archlab.config.load import model_config

    cfg = model_config(model_cfg)
    _check_choice("dtype", dtype, list(DTYPE_BYTES))
    _check_positive(batch=batch, context=context)
    return 2.0 * cfg.n_layers * cfg.kv_heads * cfg.d_head * context * batch * DTYPE_BYTES[dtype]


# ----------------------------------------------------------------------------- activations


@dataclass(frozen=True)
class _Shape:
    """What the per-component formulas need: the config and the run's shape and dtypes."""

    cfg: ModelConfig
    batch: int
    seq_len: int
    act: int  # bytes per activation element
    mask: int  # bytes per dropout-mask element
    device: str

    @property
    def n(self) -> int:
        return self.batch * self.seq_len


def _norm_saved(s: _Shape, dim: int) -> tuple[bool, float]:
    """What one norm over ``dim`` channels keeps per row: (whether it keeps its input tensor
    itself, bytes of everything else).

    LayerNorm keeps its input, mean and rstd (in the activation dtype on CPU, fp32 on CUDA).
    RMSNorm on CPU is torch's composite, which upcasts: the fp32 input (a copy unless it is
    fp32 already), rstd and the fp32 normalised x*rstd; on CUDA the fused kernel keeps the
    input and an fp32 rstd.
    """
    if s.cfg.norm.type == "layernorm":
        return True, 2 * (s.act if s.device == "cpu" else STATS_BYTES)
    if s.cfg.norm.type == "rmsnorm":
        if s.device == "cuda":
            return True, STATS_BYTES
        upcast_copy = dim * STATS_BYTES if s.act != STATS_BYTES else 0
        return s.act == STATS_BYTES, upcast_copy + STATS_BYTES + dim * STATS_BYTES
    raise ValueError(f"norm.type={s.cfg.norm.type!r}: no activation model; add one to archlab/costs/memory.py")


def _norm_bytes(s: _Shape, dim: int) -> float:
    """Per row: everything one norm keeps, its input included."""
    keeps_input, extra = _norm_saved(s, dim)
    return keeps_input * dim * s.act + extra


def _uses_math_sdpa(s: _Shape) -> bool:
    """CPU SDPA runs the math kernel when an additive mask (ALiBi) or attention dropout is on."""
    return s.device == "cpu" and (s.cfg.position.type == "alibi" or s.cfg.attention.dropout > 0)


def _attention_bytes(s: _Shape) -> float:
    """One attention layer, all N tokens: QKV input, q/k norms, what SDPA keeps, output copy."""
    cfg, n, a = s.cfg, s.n, s.act
    H, G, Dh, S = cfg.n_heads, cfg.kv_heads, cfg.d_head, s.seq_len
    rope, qk_norm = cfg.position.type == "rope", cfg.attention.qk_norm
    total = n * cfg.d_model * a  # input of wqkv
    qkv_kept = not _uses_math_sdpa(s)  # the fused kernels keep v, a view of the qkv output
    if qk_norm:  # per head and token; the norms read views of the qkv output
        keeps_input, extra = _norm_saved(s, Dh)
        total += n * (H + G) * extra
        qkv_kept = qkv_kept or keeps_input
    if qkv_kept:
        total += n * (H + 2 * G) * Dh * a
    if _uses_math_sdpa(s):  # the CPU math kernel computes in fp32 whatever the input dtype
        f = STATS_BYTES
        total += 3 * n * H * Dh * f  # q (scaled), k^T, v copies
        total += n * H * S * f  # softmax probabilities
        if cfg.attention.dropout > 0:
            total += 2 * n * H * S * f  # mask and dropped probabilities
        return total + n * H * Dh * a  # output, copied to (B, S, H*Dh) for wo
    # q and k handed to SDPA are new tensors after RoPE or the q/k norms (G key/value heads:
    # SDPA's enable_gqa reads them without repeated copies)
    if rope or qk_norm:
        total += n * (H + G) * Dh * a
    total += n * H * Dh * a + n * H * STATS_BYTES  # output + log-sum-exp
    if qk_norm and s.device == "cpu":  # normed q is (B, H, S, Dh)-contiguous: wo's input is a copy
        total += n * H * Dh * a
    if s.device == "cuda" and cfg.position.type == "alibi":
        total += H * S * S * a  # the additive bias, one per layer
    return total


def _ffn_bytes(s: _Shape, kind: str, hidden: int, n_tokens: float) -> float:
    """A dense FFN applied to ``n_tokens`` rows: its input + hidden activations."""
    if kind not in FFN_HIDDEN_SAVED:
        raise ValueError(f"ffn.type={kind!r}: no activation model; "
                         "add it to FFN_HIDDEN_SAVED in archlab/costs/memory.py")
    return n_tokens * (s.cfg.d_model + FFN_HIDDEN_SAVED[kind] * hidden) * s.act


def _router_bytes(s: _Shape) -> float:
    """The router (fp32 math): scores, chosen ids, gate weights, and what the balancing terms keep."""
    cfg, n = s.cfg, s.n
    m = cfg.moe
    E, K, f = m.num_experts, m.top_k, STATS_BYTES
    total = n * E * f + n * K * ID_BYTES  # softmax/sigmoid scores, chosen expert ids
    if s.act != f:  # the gate runs in fp32 on an fp32 copy of its (D, E) weight
        total += cfg.d_model * E * f
    if m.router.renormalize:
        total += n * K * f + n * f  # gathered weights and their sum
    if m.router.type == "sigmoid_topk" and (m.balance.aux_loss_coeff > 0 or m.balance.seq_aux_loss_coeff > 0):
        total += n * f  # the normaliser of the balancing probabilities (freed when no term reads them)
    if m.router.jitter > 0:  # the noise; the gate then keeps the jittered copy instead of x
        total += n * cfg.d_model * s.act
    # group-limited routing (n_groups > 1) keeps nothing: its ranking only picks ids, and the graph
    # behind them is freed as soon as the top-k indices are taken
    b = m.balance
    if b.z_loss_coeff > 0:
        total += n * E * f + n * f  # logits, logsumexp
    if b.aux_loss_coeff > 0:
        total += E * f  # routed fractions f_i
    if b.seq_aux_loss_coeff > 0:
        total += s.batch * E * f
    return total


def _moe_bytes(s: _Shape) -> float:
    """One MoE layer: its input, the router, the routed experts' slots, the shared experts.

    Dropless routing has N*K slots; with a capacity C the estimate uses min(N*K, E*C) (an upper
    bound: fewer slots are kept when the routing is unbalanced).
    """
    from archlab.nn.moe.experts import capacity_for

    cfg, n, a = s.cfg, s.n, s.act
    m = cfg.moe
    D, E, K = cfg.d_model, m.num_experts, m.top_k
    cap = capacity_for(n, m)
    slots = n * K if cap is None else min(n * K, E * cap)
    shared = m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)
    # the layer input: the router reads an fp32 copy, the shared experts the input itself
    total = n * D * STATS_BYTES + (n * D * a if shared and a != STATS_BYTES else 0)
    total += _router_bytes(s)
    # row <-> slot indices (slot_R a view of R + 1 ids), gates; group offsets (int32)
    total += slots * (2 * ID_BYTES + a) + ID_BYTES + 2 * E * 4
    total += _ffn_bytes(s, cfg.ffn.type, m.expert_hidden, slots)  # tokens' rows + expert hidden
    total += slots * D * a  # expert outputs, read by the gate-weighted sum
    if shared:
        total += _ffn_bytes(s, cfg.ffn.type, shared, n) - n * D * a  # its input is counted above
    return total


def _layer_bytes(s: _Shape, layer: int) -> dict[str, float]:
    """Bytes one layer keeps for backward, by component, without checkpointing."""
    cfg, n = s.cfg, s.n
    out = {"norms": 2 * n * _norm_bytes(s, cfg.d_model), "attention": _attention_bytes(s)}
    if cfg.is_moe_layer(layer):
        out["moe"] = _moe_bytes(s)
    else:
        out["ffn"] = _ffn_bytes(s, cfg.ffn.type, ffn_hidden(cfg.ffn, cfg.d_model), n)
    drops = 2 * (cfg.dropout > 0) + (cfg.ffn.dropout > 0 and not cfg.is_moe_layer(layer))
    out["dropout"] = drops * n * cfg.d_model * s.mask
    return out


def _selective_layer_bytes(s: _Shape, layer: int) -> dict[str, float]:
    """Bytes one layer keeps under selective checkpointing: its input, and the outputs of its
    matmuls and attention kernels (``archlab.model.checkpointing.SAVED_OPS``), by component."""
    cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
    H, G, Dh, D = cfg.n_heads, cfg.kv_heads, cfg.d_head, cfg.d_model
    attention = n * (H + 2 * G) * Dh * a + n * D * a  # QKV and output projections
    if _uses_math_sdpa(s):  # decomposed: the scores (B*H, S, S) and weighted values, both fp32
        attention += n * H * s.seq_len * f + n * H * Dh * f
    else:  # the fused kernel's output and log-sum-exp
        attention += n * H * Dh * a + n * H * f
    out = {"checkpoint": float(n * D * a), "attention": float(attention)}
    up = FFN_UP_WIDTH[cfg.ffn.type]
    if cfg.is_moe_layer(layer):
        from archlab.nn.moe.experts import capacity_for

        m = cfg.moe
        cap = capacity_for(n, m)
        slots = n * m.top_k if cap is None else min(n * m.top_k, m.num_experts * cap)
        shared = m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)
        moe = n * m.num_experts * f + slots * (up * m.expert_hidden + D) * a  # gate logits (fp32), experts
        if shared:
            moe += n * (up * shared + D) * a
        out["moe"] = float(moe)
    else:
        out["ffn"] = float(n * (up * ffn_hidden(cfg.ffn, D) + D) * a)
    return out


@dataclass(frozen=True)
class ActivationMemory:
    """Bytes saved for backward by one training micro-batch (B sequences of S tokens)."""

    layers: tuple  # per layer: {component: bytes}
    model: dict = field(default_factory=dict)  # embedding, positions, head, loss
    checkpointing: str = "none"  # none | full | selective
    recompute_peak: float = 0.0  # checkpointing: one layer's activations recomputed in backward, beyond what it kept

    @property
    def total(self) -> float:
        return sum(self.by_component().values())

    def per_layer(self, layer: int) -> float:
        return sum(self.layers[layer].values())

    def by_component(self) -> dict[str, float]:
        """Component -> bytes over all layers, then the model-level parts."""
        out: dict[str, float] = {}
        for layer in self.layers:
            for k, v in layer.items():
                out[k] = out.get(k, 0.0) + v
        out.update(self.model)
        return out


def checkpoint_mode(checkpointing) -> str:
    """``none | full | selective``; ``True``/``False`` (the older flag) mean full / none."""
    if isinstance(checkpointing, bool):
        return "full" if checkpointing else "none"
    _check_choice("checkpointing", checkpointing, CHECKPOINTING)
    return checkpointing


def _model_bytes(s: _Shape, loss: str, checkpointing: str) -> dict[str, float]:
    """The parts outside the blocks: token window, positions, final norm, LM head + loss."""
    cfg, n, a = s.cfg, s.n, s.act
    D, V = cfg.d_model, cfg.vocab_size
    if loss == "fused":  # gradients wrt h and the head's weight (the model's dtype), the token count
        head_loss = n * D * a + V * D * a + ID_BYTES
    else:  # the head's input, fp32 log-softmax, a copy of the (strided) targets, the total weight
        head_loss = n * D * a + n * V * STATS_BYTES + n * ID_BYTES + STATS_BYTES
    rope = cfg.position.type == "rope" and checkpointing == "none"  # else inside the recomputed blocks
    return {
        # the (B, S+1) window, position ids, dropout mask
        "embedding": s.batch * (s.seq_len + 1) * ID_BYTES
        + (s.seq_len * ID_BYTES if cfg.position.type == "learned" else 0) + (n * D * s.mask if cfg.dropout > 0 else 0),
        "positions": 2 * s.seq_len * cfg.d_head * STATS_BYTES if rope else 0.0,  # RoPE cos/sin, all layers
        "head": n * _norm_bytes(s, D) if cfg.norm.placement == "pre" else 0.0,  # the final norm
        "loss": float(head_loss),
    }


def activation_memory(model_cfg, batch: int, seq_len: int, dtype: str = "bf16", device: str = "cuda",
                      checkpointing="none", loss: str = "fused") -> ActivationMemory:
    """Activations kept for backward by one micro-batch of the trainer's step, by layer and component.

    dtype: activation dtype (``bf16`` or ``fp32``); device: ``cuda`` or ``cpu`` (kernels and
    dropout masks differ, see the module docstring); checkpointing: ``none | full | selective``
    (the trainer's ``train.activation_checkpointing``); loss: ``fused`` (the trainer's LM-head
    cross-entropy) or ``logits`` (cross-entropy on materialised fp32 logits).
    """
    from archlab.config.load import model_config

    cfg = model_config(model_cfg)
    _check_positive(batch=batch, seq_len=seq_len)
    _check_choice("dtype", dtype, list(DTYPE_BYTES))
    _check_choice("device", device, list(DEVICES))
    _check_choice("loss", loss, LOSSES)
    mode = checkpoint_mode(checkpointing)
    act = DTYPE_BYTES[dtype]
    s = _Shape(cfg, batch, seq_len, act, act if device == "cpu" else 1, device)
    full = [_layer_bytes(s, i) for i in range(cfg.n_layers)]
    model = _model_bytes(s, loss, mode)
    if mode == "none":
        return ActivationMemory(layers=tuple(full), model=model)
    if mode == "full":
        kept = tuple({"checkpoint": float(s.n * cfg.d_model * act)} for _ in range(cfg.n_layers))
    else:
        kept = tuple(_selective_layer_bytes(s, i) for i in range(cfg.n_layers))
    peak = max(sum(f.values()) - sum(k.values()) for f, k in zip(full, kept))
    return ActivationMemory(layers=kept, model=model, checkpointing=mode, recompute_peak=peak)


def training_memory(model_cfg, batch: int, seq_len: int, precision: str = "bf16", zero_stage: int = 0,
                    dp: int = 1, ep: int | None = None, device: str = "cuda", checkpointing="none",
                    loss: str = "fused") -> dict[str, float]:
    """Per-rank bytes of one training step: model states + activations of one micro-batch."""
    states = model_state_memory(model_cfg, precision, zero_stage, dp, ep)
    acts = activation_memory(model_cfg, batch, seq_len, dtype=precision, device=device,
                             checkpointing=checkpointing, loss=loss)
    out = states.as_dict()
    out["activations"] = acts.total + acts.recompute_peak
    out["total"] = states.total + out["activations"]
    return out
