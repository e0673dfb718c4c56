"""Memory from the config alone: model states under ZeRO, activations saved for backward, KV cache.

Shape legend: B batch, S sequence, N = B*S tokens, D model dim, H query heads, G key/value heads,
Dh head dim, F ffn hidden dim, E routed experts, K experts per token, V vocabulary, L layers.

Each component states the bytes it keeps for backward (``saved_bytes`` in ``archlab.nn``); this module adds
them up by layer, adds the model-level parts (token window, positions, final norm, head and loss), the model
states (weights, gradients and the optimizer's state per role, sharded by ZeRO stage and expert parallelism)
and what activation checkpointing keeps. What each term counts and why: docs/methods/memory.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import DictConfig

from archlab.config.schema import model_config
from archlab.costs.flops import sequence_lengths
from archlab.costs.params import param_counts
from archlab.model import build_model, model_class
from archlab.nn.attention import attention_class
from archlab.nn.attention.cross import CrossAttention
from archlab.nn.component import ID_BYTES, STATS_BYTES, ActShape
from archlab.nn.ffn import ffn_class
from archlab.nn.moe.balance import enabled_term_classes
from archlab.nn.moe.router import router_class
from archlab.nn.norms import norm_class
from archlab.nn.positions import position_class
from archlab.objectives import objective_class, objective_name
from archlab.optim import OPTIMIZERS, ROLES, param_roles

DTYPE_BYTES = {"fp32": 4, "bf16": 2}
# bytes per parameter: (weights, gradients, fp32 master copy); the optimizer's state comes from its class
PRECISIONS = {"fp32": (4, 4, 0), "bf16": (2, 2, 4)}
DEVICES = ("cpu", "cuda")
CHECKPOINTING = ("none", "full", "selective")  # archlab.model.checkpointing.MODES
LOSSES = ("fused", "logits")
_Shape = ActShape  # the per-component formulas take an archlab.nn.component.ActShape


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
    """Bytes one rank holds for weights, gradients and optimizer states (a bf16 run's fp32 master
    copy included in ``optimizer``)."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer}


def _optimizer_name(model_cfg, optimizer: str | None) -> str:
    """``optimizer``, else a full recipe's ``train.optimizer``, else adamw."""
    if optimizer is not None:
        return optimizer
    if isinstance(model_cfg, DictConfig) and "train" in model_cfg and "d_model" not in model_cfg:
        return str(model_cfg.train.get("optimizer") or "adamw")
    return "adamw"


def optimizer_state_bytes(model_cfg, optimizer: str = "adamw") -> tuple[float, float]:
    """(dense, routed experts): bytes of the optimizer's own state (fp32 moments, momentum; no master
    copy) for the whole model, from what ``optimizer``'s class keeps per parameter of each role. Roles
    are counted on a meta-device build when the class tells them apart; the routed experts are
    hidden matrices."""
    cfg = model_config(model_cfg)
    _check_choice("optimizer", optimizer, OPTIMIZERS.names())
    opt = OPTIMIZERS.get(optimizer)
    counts = param_counts(cfg)
    per_role = {role: opt.state_bytes_per_param(role) for role in ROLES}
    expert = per_role["hidden"] * counts.routed_experts
    if len(set(per_role.values())) == 1:
        return per_role["hidden"] * (counts.dense + counts.mtp), expert
    model = build_model(cfg, device="meta")
    total = sum(p.numel() * per_role[role] for _, p, role in param_roles(model))
    return total - expert, expert


def model_state_memory(model_cfg, precision: str = "bf16", zero_stage: int = 0, dp: int = 1,
                       ep: int | None = None, optimizer: str | None = None) -> ModelStateMemory:
    """Per-rank bytes of the model states of training with ``optimizer`` (default: a recipe's
    ``train.optimizer``, adamw for a model config).

    precision: ``fp32`` or ``bf16`` (mixed: bf16 weights/grads, fp32 master + optimizer state).
    zero_stage: 0 (none) .. 3; dp: data-parallel ranks; ep: expert-parallel ranks (default the
    recipe's ``moe.ep_size``; must divide dp and the number of experts).
    """
    optimizer = _optimizer_name(model_cfg, optimizer)
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
    edp = dp // ep  # ranks holding the same experts

    def per_rank(dense: float, experts: float, sharded: bool) -> float:
        """``dense`` and ``experts`` bytes (whole model) held by one rank: experts split over ep first."""
        return dense / dp + experts / ep / edp if sharded else dense + experts / ep

    w, g, master = PRECISIONS[precision]
    state_dense, state_experts = optimizer_state_bytes(cfg, optimizer)
    dense = counts.dense + counts.mtp  # the MTP modules train like the rest (routed experts inside them aside)
    return ModelStateMemory(
        weights=w * per_rank(dense, counts.routed_experts, zero_stage >= 3),
        grads=g * per_rank(dense, counts.routed_experts, zero_stage >= 2),
        optimizer=per_rank(master * dense + state_dense, master * counts.routed_experts + state_experts,
                           zero_stage >= 1))


# ----------------------------------------------------------------------------- KV cache


def kv_cache_bytes(model_cfg, batch: int, context: int, dtype: str = "bf16", memory_len: int | None = None) -> float:
    """Inference cache of ``batch`` sequences at ``context`` positions, summed over the layers as
    each attention variant keeps it (MHA/GQA/MQA: 2 * G * Dh per position; a sliding window: at
    most W - 1 positions; MLA: the latent and the RoPE key). An encoder keeps none: 0 (it reads its
    whole window in one forward and generates nothing; ``new_kv_cache`` and ``generate`` refuse it). An
    encoder-decoder: its decoder's self-attention cache of ``context`` generated positions, plus each decoder
    layer's cross-attention keys/values of the ``memory_len`` (default ``context``) encoder positions,
    computed once per sequence (``CrossAttention.kv_cache_bytes``). The model type's class composes it
    (``kv_cache_bytes``, ``archlab.model``)."""
    cfg = model_config(model_cfg)
    _check_choice("dtype", dtype, list(DTYPE_BYTES))
    _check_positive(batch=batch, context=context)
    return batch * model_class(cfg).kv_cache_bytes(cfg, context, DTYPE_BYTES[dtype], memory_len=memory_len)


# ----------------------------------------------------------------------------- activations


def _norm_bytes(s: ActShape, dim: int) -> float:
    """Per row: everything one norm keeps, its input included (the norm class says)."""
    return norm_class(s.cfg).saved_bytes(s, dim=dim)


def _ffn_bytes(s: ActShape, hidden: int, n_tokens: float) -> float:
    """A dense FFN of ``ffn.type`` applied to ``n_tokens`` rows: its input + hidden activations."""
    return ffn_class(s.cfg).saved_bytes(s, hidden=hidden, n_tokens=n_tokens)


def _router_bytes(s: _Shape) -> float:
    """The router (fp32 math) and the enabled balancing terms: the bytes each of their classes says
    it keeps (``Router.saved_bytes``, ``BalanceTerm.saved_bytes``; one without a model raises)."""
    terms = enabled_term_classes(s.cfg.moe.balance)
    router = router_class(s.cfg)
    return router.saved_bytes(s, probs_read=any(t.reads_probs for t in terms)) + sum(t.saved_bytes(s) for t in terms)


def _moe_bytes(s: _Shape) -> float:
    """One MoE layer: its input, the router, the routed experts' slots, the shared experts.

    Dropless routing has N*K slots; with a capacity C the estimate uses min(N*K, E*C) (an upper
    bound: fewer slots are kept when the routing is unbalanced).
    """
    cfg, n, a = s.cfg, s.n, s.act
    m = cfg.moe
    D, E = cfg.d_model, m.num_experts
    router = router_class(cfg)
    slots = router.kept_slots(m, n)
    gathered = router.gathered_slots(m, n)  # the slot-indexed tensors the gate-weighted sum reads
    shared = m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)
    # the layer input: the router reads an fp32 copy, the shared experts the input itself
    total = n * D * STATS_BYTES + (n * D * a if shared and a != STATS_BYTES else 0)
    total += _router_bytes(s)
    # row <-> slot indices (slot_R a view of R + 1 ids), gates; group offsets (int32)
    total += slots * ID_BYTES + gathered * (ID_BYTES + a) + ID_BYTES + 2 * E * 4
    total += _ffn_bytes(s, m.expert_hidden, slots)  # tokens' rows + expert hidden
    total += gathered * D * a  # expert outputs, read by the gate-weighted sum
    if shared:
        total += _ffn_bytes(s, shared, n) - n * D * a  # its input is counted above
    return total


def _moe_keeps_input(s: _Shape) -> bool:
    """Whether an MoE layer keeps its input tensor itself: the router's fp32 copy is the input in an fp32
    model (without jitter, which makes the gate read x * noise), and shared experts read the input."""
    m = s.cfg.moe
    return (s.act == STATS_BYTES and m.router.jitter == 0) or m.n_shared_experts > 0


def _layer_bytes(s: _Shape, layer: int) -> dict[str, float]:
    """Bytes one layer keeps for backward, by component, without checkpointing."""
    cfg, n = s.cfg, s.n
    block = model_class(cfg).layer_class(cfg)
    out = {"norms": float(block.norms_saved_bytes(s)),
           "attention": attention_class(cfg, layer).saved_bytes(s, layer=layer)}
    # a parallel block with one norm: the FFN's input is the attention's, kept once (counted with the attention)
    shared = n * cfg.d_model * s.act if block.ffn_reads_attention_input(cfg) else 0
    if cfg.is_moe_layer(layer):
        out["moe"] = _moe_bytes(s) - (shared if _moe_keeps_input(s) else 0)
    else:
        out["ffn"] = _ffn_bytes(s, cfg.ffn_hidden, n) - shared
    drops = 2 * (cfg.dropout > 0) + (cfg.ffn.dropout > 0 and not cfg.is_moe_layer(layer))
    out["dropout"] = drops * n * cfg.d_model * s.mask
    return out


def _selective_layer_bytes(s: _Shape, layer: int) -> dict[str, float]:
    """Bytes one layer keeps under selective checkpointing: its input, and the outputs of its
    matmuls and attention kernels (``archlab.model.checkpointing.SAVED_OPS``), by component."""
    cfg, n, a, f = s.cfg, s.n, s.act, STATS_BYTES
    D = cfg.d_model
    attention = attention_class(cfg, layer).selective_saved_bytes(s, layer=layer)
    out = {"checkpoint": float(n * D * a), "attention": float(attention)}
    ffn = ffn_class(cfg)
    if cfg.is_moe_layer(layer):
        m = cfg.moe
        slots = router_class(cfg).kept_slots(cfg.moe, n)
        shared = m.n_shared_experts * (m.shared_hidden if m.shared_hidden is not None else m.expert_hidden)
        moe = n * m.num_experts * f + ffn.selective_saved_bytes(s, hidden=m.expert_hidden, n_tokens=slots)
        if shared:  # gate logits (fp32), the experts' and shared experts' projections
            moe += ffn.selective_saved_bytes(s, hidden=shared, n_tokens=n)
        out["moe"] = float(moe)
    else:
        out["ffn"] = float(ffn.selective_saved_bytes(s, hidden=cfg.ffn_hidden, n_tokens=n))
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


def layer_saved_bytes(s: _Shape, layer: int, checkpointing: str) -> float:
    """Bytes one block built as ``layer`` keeps in the given checkpointing mode (what it keeps, not
    the recomputation): the per-layer formulas, for a block outside the stack (an MTP module's)."""
    if checkpointing == "none":
        return sum(_layer_bytes(s, layer).values())
    if checkpointing == "full":
        return float(s.n * s.cfg.d_model * s.act)
    return sum(_selective_layer_bytes(s, layer).values())


def _model_bytes(s: _Shape, loss: str, checkpointing: str, objective: str) -> dict[str, float]:
    """The parts outside the blocks: token window, positions, final norm, and what the objective's
    LM head and loss keep (``archlab.objectives``: ``saved_bytes``)."""
    cfg, n = s.cfg, s.n
    D = cfg.d_model
    head = objective_class(objective)
    positions = position_class(cfg)
    return {
        # the (B, S + ahead) window (inputs and targets are views of it), dropout mask
        "embedding": s.batch * (s.seq_len + head.ahead(cfg)) * ID_BYTES
        + (n * D * s.mask if cfg.dropout > 0 else 0),
        # learned: the position ids; RoPE: cos/sin, shared by all layers (checkpointing: inside the blocks)
        "positions": float(positions.saved_bytes(s, checkpointing)),
        "head": n * _norm_bytes(s, D) if cfg.norm.placement == "pre" else 0.0,  # the final norm
        # an encoder's norm on the summed embeddings (BERT): its input and statistics
        "embed_norm": n * _norm_bytes(s, D) if getattr(cfg, "embed_norm", False) else 0.0,
        # the loss (and e.g. the MTP modules)
        **head.saved_bytes(s, loss, checkpointing, lambda layer: layer_saved_bytes(s, layer, checkpointing)),
    }


def activation_memory(model_cfg, batch: int, seq_len: int, dtype: str = "bf16", device: str = "cuda",
                      checkpointing="none", loss: str = "fused", objective: str | None = None) -> ActivationMemory:
    """Activations kept for backward by one micro-batch of the trainer's step, by layer and component.

    dtype: activation dtype (``bf16`` or ``fp32``); device: ``cuda`` or ``cpu`` (kernels and
    dropout masks differ, see the module docstring); checkpointing: ``none | full | selective``
    (the trainer's ``train.activation_checkpointing``); loss: ``fused`` (the trainer's LM-head
    cross-entropy) or ``logits`` (cross-entropy on materialised fp32 logits); objective: the training
    objective (default: a recipe's ``train.objective``, see ``archlab.costs.flops.forward_flops``).
    """
    objective = objective_name(model_cfg, objective)
    cfg = model_config(model_cfg)
    _check_positive(batch=batch, seq_len=seq_len)
    _check_choice("dtype", dtype, list(DTYPE_BYTES))
    _check_choice("device", device, list(DEVICES))
    _check_choice("loss", loss, LOSSES)
    mode = checkpoint_mode(checkpointing)
    act = DTYPE_BYTES[dtype]
    compose = COMPOSE[model_class(cfg).stacks]  # the model type's stacks, composed here
    return compose(model_cfg, batch, seq_len, act, device, mode, loss, objective)


def stack_activations(model_cfg, batch: int, seq_len: int, act: int, device: str, mode: str, loss: str,
                      objective: str) -> ActivationMemory:
    """One stack of blocks (a decoder or an encoder) on a window of ``seq_len`` ids: each layer's saved
    tensors as its components state them, the model level (embedding, positions, head and loss), and what
    checkpointing keeps."""
    cfg = model_config(model_cfg)
    s = _Shape(cfg, batch, seq_len, act, act if device == "cpu" else 1, device)
    full = [_layer_bytes(s, i) for i in range(cfg.n_layers)]
    model = _model_bytes(s, loss, mode, objective)
    if mode == "none":
        return ActivationMemory(layers=tuple(full), model=model)
    if mode == "full":
        kept = tuple({"checkpoint": float(s.n * cfg.d_model * act)} for _ in range(cfg.n_layers))
    else:
        kept = tuple(_selective_layer_bytes(s, i) for i in range(cfg.n_layers))
    peak = max(sum(f.values()) - sum(k.values()) for f, k in zip(full, kept))
    return ActivationMemory(layers=kept, model=model, checkpointing=mode, recompute_peak=peak)


def encoder_decoder_activations(model_cfg, batch: int, seq_len: int, act: int, device: str, mode: str, loss: str,
                                objective: str) -> ActivationMemory:
    """An encoder-decoder's activations for a text window of ``seq_len`` ids: the encoder's layers on its M
    input ids, the decoder's on its T targets (``archlab.costs.flops.sequence_lengths``), each decoder layer's
    cross-attention norm and cross-attention (:class:`archlab.nn.attention.cross.CrossAttention`), and once
    the memory (the encoder's output, the K/V projections' shared input). Model level: the encoder and
    decoder ids (the embedding's indices), each stack's positions and final norm, the head and loss on the T
    targets. ``full`` checkpointing: each block keeps its input (the memory is an input of every decoder
    block, the same tensor); ``selective``: each block keeps its input and its matmul and attention outputs, the
cross-attention's included."""
    cfg = model_config(model_cfg)
    M, T = sequence_lengths(model_cfg, seq_len)
    mask = act if device == "cpu" else 1
    enc, dec = _Shape(cfg, batch, M, act, mask, device), _Shape(cfg, batch, T, act, mask, device)
    D = cfg.d_model
    layers = []
    for i in range(cfg.n_layers):
        layers.append({f"encoder_{k}": v for k, v in _layer_bytes(enc, i).items()})
    for i in range(cfg.n_layers):
        cross = CrossAttention.saved_bytes(dec, M)
        layers.append({**{f"decoder_{k}": v for k, v in _layer_bytes(dec, i).items()},
                       "cross_norm": dec.n * _norm_bytes(dec, D), "cross_attention": cross,
                       "cross_dropout": dec.n * D * mask if cfg.dropout > 0 else 0})  # its residual branch's
    positions = position_class(cfg)
    drops = (enc.n + dec.n) * D * mask * 2 if cfg.dropout > 0 else 0  # after each embedding, after each stack
    model = {"embedding": (enc.n + dec.n) * ID_BYTES + drops,
             "positions": float(positions.saved_bytes(enc, mode) + positions.saved_bytes(dec, mode)),
             "head": (enc.n + dec.n) * _norm_bytes(dec, D) if cfg.norm.placement == "pre" else 0.0,
             "memory": float(enc.n * D * act),
             **objective_class(objective).saved_bytes(dec, loss, mode,
                                                      lambda layer: layer_saved_bytes(dec, layer, mode))}
    if mode == "none":
        return ActivationMemory(layers=tuple(layers), model=model)
    if mode == "full":
        kept = tuple({"checkpoint": float(n * D * act)} for n in [enc.n] * cfg.n_layers + [dec.n] * cfg.n_layers)
    else:
        cross = CrossAttention.selective_saved_bytes(dec, M)
        kept = tuple([_selective_layer_bytes(enc, i) for i in range(cfg.n_layers)]
                     + [{**_selective_layer_bytes(dec, i), "cross_attention": cross} for i in range(cfg.n_layers)])
    peak = max(sum(f.values()) - sum(k.values()) for f, k in zip(layers, kept))
    return ActivationMemory(layers=kept, model=model, checkpointing=mode, recompute_peak=peak)


# a model type's ``stacks`` -> how its activations compose: one stack, or an encoder and a cross-attending decoder
COMPOSE = {1: stack_activations, 2: encoder_decoder_activations}


def training_memory(model_cfg, batch: int, seq_len: int, precision: str = "bf16", zero_stage: int = 0,
                    dp: int = 1, ep: int | None = None, device: str = "cuda", checkpointing="none",
                    loss: str = "fused", optimizer: str | None = None) -> dict[str, float]:
    """Per-rank bytes of one training step: model states (of ``optimizer``, default the recipe's)
    + activations of one micro-batch."""
    states = model_state_memory(model_cfg, precision, zero_stage, dp, ep, optimizer)
    acts = activation_memory(model_cfg, batch, seq_len, dtype=precision, device=device,
                             checkpointing=checkpointing, loss=loss)
    out = states.as_dict()
    out["activations"] = acts.total + acts.recompute_peak
    out["total"] = states.total + out["activations"]
    return out
