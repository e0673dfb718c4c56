"""A plan before a GPU is rented: per-GPU memory of a recipe's training step under a launch, whether it fits a
GPU, tokens/s at a stated MFU and the hours to the recipe's token budget.

    from archlab.costs.plan import read_launch, memory_plan, training_plan
    launch = read_launch("recipes/launch/zero2.yaml", gpus=8)
    memory_plan(recipe, launch).peak                      # bytes one GPU needs at its peak
    training_plan(recipe, launch, gpu="h100", mfu=0.4)    # + fits?, tokens/s, hours, GPU-hours

Two precision regimes, as the trainer runs them:

- ``autocast`` (one process or DDP, ``train.precision`` bf16): accelerate's ``torch.autocast``; fp32
  weights, fp32 gradients, AdamW's fp32 m and v; the matmuls' weights cast to bf16 while the forward
  runs (autocast's cast cache, and the copies autograd saves), bf16 matmul outputs, the residual stream
  (what the norms and checkpointed blocks keep) in fp32. DDP (world > 1) adds its gradient buckets (the
  gradients' size: accelerate leaves ``gradient_as_bucket_view`` off).
- ``deepspeed`` bf16: the engine casts the module to bf16 (no autocast): bf16 weights and gradients, fp32
  master copy + m + v (``archlab.costs.memory.model_state_memory``), ZeRO stages sharding them over the
  data-parallel ranks, expert parallelism the routed experts; the step converts this rank's gradient
  partition to fp32.

fp32 runs: 4 + 4 + 8 bytes per parameter, fp32 activations. The peak: weights, optimizer state and buckets
always, plus the largest of (a) the forward's end (every saved activation, autocast's weight copies), (b) each
point of backward, which runs the blocks last to first: the blocks not yet done keep their activations, the
ones done have their gradients (with ``grad_accum`` > 1 every gradient exists throughout), plus the block being
recomputed under checkpointing, (c) the optimizer step: every gradient and the step's fp32 temporaries.
Checked against torch's own accounting (FakeTensorMode + MemTracker): tests/costs/test_costs_plan.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf
from torch import nn

from archlab.config.schema import model_config
from archlab.costs.flops import training_flops_per_token
from archlab.costs.memory import CHECKPOINTING, activation_memory, checkpoint_mode, model_state_memory
from archlab.costs.params import param_counts
from archlab.model import build_model
from archlab.nn.ffn import ffn_class
from archlab.nn.moe.router import router_class
from archlab.objectives import objective_type
from archlab.optim.adamw import adamw_param_groups


@dataclass(frozen=True)
class Gpu:
    """A GPU model: its memory as ``nvidia-smi`` reports it and its peak dense bf16 FLOP/s."""

    name: str
    memory_bytes: float
    peak_flops: float


GPUS = {
    "h100": Gpu("H100 SXM 80GB", 81559 * 2**20, 989e12),
    "h200": Gpu("H200 141GB", 143771 * 2**20, 989e12),
    "a100": Gpu("A100 SXM 80GB", 81920 * 2**20, 312e12),
}
BACKENDS = ("plain", "deepspeed")  # plain: one process, or DDP when world > 1
PRECISIONS = ("bf16", "fp32")
GiB = 2**30


@dataclass(frozen=True)
class Launch:
    """What the launcher decides: processes, DeepSpeed or not, ZeRO stage; ``source`` says where from."""

    world: int = 1
    backend: str = "plain"
    zero_stage: int = 0
    source: str = "one process"

    def describe(self) -> str:
        if self.backend == "deepspeed":
            how = f"DeepSpeed ZeRO-{self.zero_stage}"
        else:
            how = "DDP" if self.world > 1 else "one process"
        return f"{self.world} GPU{'s' if self.world > 1 else ''}, {how} ({self.source})"


def _deepspeed_stage(path: Path) -> int:
    """``zero_optimization.stage`` of a DeepSpeed JSON config (0 when absent)."""
    try:
        node = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable DeepSpeed JSON config ({e}); pass e.g. recipes/launch/zero2.json")
    stage = (node.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{path}: zero_optimization.stage={stage!r}: must be 0, 1, 2 or 3")
    return int(stage)


def read_launch(path=None, gpus: Optional[int] = None) -> Launch:
    """The launch of an accelerate config (``recipes/launch/*.yaml``: ``distributed_type``, ``num_processes``,
    the DeepSpeed file's ZeRO stage) or of a DeepSpeed JSON config (``zero*.json``: its stage, 1 process);
    none: one process, DDP when ``gpus`` > 1. ``gpus`` overrides the number of processes."""
    if gpus is not None and (not isinstance(gpus, int) or gpus <= 0):
        raise ValueError(f"gpus={gpus!r}: must be a positive integer")
    if path is None:
        return Launch(world=gpus or 1, source="no launch config")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such launch config; pass an accelerate YAML or DeepSpeed JSON of recipes/launch")
    if path.suffix == ".json":
        return Launch(world=gpus or 1, backend="deepspeed", zero_stage=_deepspeed_stage(path), source=str(path))
    try:
        node = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as e:  # not YAML
        raise ValueError(f"{path}: not a readable accelerate config ({e}); pass one of recipes/launch/*.yaml")
    if not isinstance(node, dict) or "distributed_type" not in node:
        raise ValueError(f"{path}: not an accelerate config (no distributed_type); pass one of recipes/launch/*.yaml")
    world = gpus or int(node.get("num_processes") or 1)
    kind = str(node["distributed_type"])
    if kind != "DEEPSPEED":
        return Launch(world=world, source=str(path))
    ds = node.get("deepspeed_config") or {}
    if ds.get("deepspeed_config_file"):
        ds_file = Path(ds["deepspeed_config_file"])
        if not ds_file.is_absolute() and not ds_file.exists():
            ds_file = path.parent / ds_file.name  # accelerate reads it from the working directory (repo root)
        stage = _deepspeed_stage(ds_file)
    else:
        stage = int(ds.get("zero_stage", 0))
    return Launch(world=world, backend="deepspeed", zero_stage=stage, source=str(path))


def _train(recipe, key: str, default):
    train = recipe.get("train") if hasattr(recipe, "get") else None
    return train.get(key, default) if train is not None else default


def _cast_count(module, ep: int) -> float:
    """Parameters of ``module`` autocast casts to bf16 for its matmuls: every linear weight but the routers'
    (fp32 math), the routed experts' matrices (this rank's: 1/ep)."""
    total = 0.0
    for name, sub in module.named_modules():
        if isinstance(sub, nn.Linear) and "router" not in name.split("."):
            total += sub.weight.numel()
        elif hasattr(sub, "w_up"):  # routed experts: (E, ...) matrices
            total += sum(p.numel() for p in sub.parameters(recurse=False) if p.dim() >= 2) / ep
    return total


def _param_split(module) -> tuple[float, float]:
    """(dense, routed experts) parameters of ``module``."""
    experts = sum(p.numel() for sub in module.modules() if hasattr(sub, "w_up") for p in sub.parameters(recurse=False))
    return sum(p.numel() for p in module.parameters()) - experts, float(experts)


def _blocks(cfg, ep: int, n_layers: int) -> tuple[list[tuple[float, float]], list[float], float]:
    """Per block in forward order: (dense, expert) parameters and autocast-cast parameters; and the cast
    parameters of the whole model (a tied LM head's table included: the embedding is looked up, not cast).
    A model whose blocks do not line up with ``n_layers`` activation entries: the block totals split evenly."""
    model = build_model(cfg, device="meta")
    blocks = [*getattr(model, "encoder_blocks", []), *getattr(model, "blocks", [])]
    casts = [_cast_count(b, ep) for b in blocks]
    params = [_param_split(b) for b in blocks]
    total_cast = _cast_count(model, ep) + (cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0)
    if len(blocks) != n_layers:
        dense, experts = sum(p[0] for p in params), sum(p[1] for p in params)
        params = [(dense / n_layers, experts / n_layers)] * n_layers
        casts = [sum(casts) / n_layers] * n_layers
    return params, casts, total_cast


# the parts of the activations that hold the residual stream: fp32 under autocast
RESIDUAL_PARTS = ("norms", "head", "embed_norm", "checkpoint")


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes one GPU holds, by part, and the step's peak."""

    regime: str  # autocast | deepspeed | fp32
    weights: float
    grads: float
    optimizer: float  # AdamW m, v (+ a DeepSpeed bf16 run's fp32 master copy)
    weight_copies: float  # autocast: the bf16 copies of the matmul weights during the forward
    grad_buckets: float  # DDP's gradient buckets (world > 1)
    activations: float  # saved for backward by one micro-batch, + one block's recomputation
    step_temp: float  # optimizer step: fp32 temporaries (foreach AdamW's, DeepSpeed's fp32 gradient partition)
    backward: float  # the forward/backward peak beyond weights, optimizer state and buckets

    @property
    def states(self) -> float:
        return self.weights + self.grads + self.optimizer + self.grad_buckets

    @property
    def peak(self) -> float:
        held = self.weights + self.optimizer + self.grad_buckets
        return held + max(self.backward, self.grads + self.step_temp)

    def as_dict(self) -> dict[str, float]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "weight_copies": self.weight_copies, "grad_buckets": self.grad_buckets,
                "activations": self.activations, "step_temp": self.step_temp, "backward": self.backward,
                "peak": self.peak}

    def summary(self, where: str = "GPU") -> str:
        """One line: ``X GiB per GPU at peak (regime; GiB: weights a, grads b, optimizer c, activations d, ...)``
        (MiB below 1 GiB)."""
        scale, unit = (GiB, "GiB") if self.peak >= GiB else (2**20, "MiB")
        parts = [("weights", self.weights), ("grads", self.grads), ("optimizer", self.optimizer),
                 ("activations", self.activations), ("bf16 weight copies", self.weight_copies),
                 ("DDP buckets", self.grad_buckets)]
        shown = ", ".join(f"{k} {v / scale:.3g}" for i, (k, v) in enumerate(parts) if v or i < 4)
        return f"{self.peak / scale:.3g} {unit} per {where} at peak ({self.regime}; {unit}: {shown})"


def memory_plan(recipe, launch: Launch = Launch(), precision: Optional[str] = None, checkpointing=None,
                batch: Optional[int] = None, seq_len: Optional[int] = None, grad_accum: Optional[int] = None,
                ep: Optional[int] = None, device: str = "cuda") -> MemoryPlan:
    """Per-GPU bytes of one training step of ``recipe`` (a full recipe) under ``launch``.

    Defaults from the recipe: precision ``train.precision`` (auto: bf16 on a GPU, fp32 on cpu), checkpointing
    ``train.activation_checkpointing``, ``train.micro_batch_size``, ``train.seq_len``, ``train.grad_accum``,
    ``model.moe.ep_size``. ``device``: the kernels the activations are for (cuda | cpu).
    """
    cfg = model_config(recipe)
    if precision is None or precision == "auto":
        precision = str(_train(recipe, "precision", "auto"))
        if precision == "auto":
            precision = "bf16" if device == "cuda" else "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: must be one of {', '.join(PRECISIONS)}")
    if launch.backend not in BACKENDS:
        raise ValueError(f"backend={launch.backend!r}: must be one of {', '.join(BACKENDS)}")
    mode = checkpoint_mode(checkpointing if checkpointing is not None
                           else str(_train(recipe, "activation_checkpointing", "none")))
    if mode not in CHECKPOINTING:
        raise ValueError(f"checkpointing={mode!r}: must be one of {', '.join(CHECKPOINTING)}")
    batch = batch or int(_train(recipe, "micro_batch_size", 1))
    seq_len = seq_len or int(_train(recipe, "seq_len", cfg.max_seq_len))
    grad_accum = grad_accum or int(_train(recipe, "grad_accum", 1))
    ep = ep if ep is not None else (cfg.moe.ep_size if cfg.moe is not None else 1)
    deepspeed = launch.backend == "deepspeed"
    if ep > 1 and not deepspeed:
        raise ValueError(f"model.moe.ep_size={ep}: expert parallelism runs under DeepSpeed only; "
                         "pass a DeepSpeed launch (e.g. --launch recipes/launch/zero0.yaml) or ep_size 1")
    if deepspeed and launch.zero_stage == 3 and cfg.moe is not None:
        raise ValueError("ZeRO-3 with an MoE model: refused by the trainer (DeepSpeed's MoE ends at stage 2); "
                         "use recipes/launch/zero2.yaml")
    if ep > 1 and launch.world % ep:
        raise ValueError(f"model.moe.ep_size={ep} must divide the number of GPUs ({launch.world}); pass --gpus")
    counts = param_counts(cfg)
    autocast = precision == "bf16" and not deepspeed
    stage = launch.zero_stage if deepspeed else 0
    states = model_state_memory(recipe, "fp32" if autocast else precision, stage, launch.world, ep)
    sharded_params = counts.dense + counts.mtp + counts.routed_experts / ep  # held by this rank
    acts = activation_memory(recipe, batch, seq_len, dtype=precision, device=device, checkpointing=mode)
    layers = [dict(layer) for layer in acts.layers]
    if autocast:  # the residual stream in fp32
        wide = activation_memory(recipe, batch, seq_len, dtype="fp32", device=device, checkpointing=mode)
        for layer, fp32 in zip(layers, wide.layers):
            for k in RESIDUAL_PARTS:
                if k in layer:
                    layer[k] = fp32[k]
        model_acts = {k: (wide.model[k] if k in RESIDUAL_PARTS else v) for k, v in acts.model.items()}
    else:
        model_acts = dict(acts.model)
    params, casts, total_cast = _blocks(cfg, ep, len(layers))
    copies = 2.0 * total_cast if autocast else 0.0
    recompute = acts.recompute_peak
    if autocast and mode != "none":  # the block recomputed in backward: its fp32 residual parts, its weight copies
        full = activation_memory(recipe, batch, seq_len, dtype="bf16", device=device).layers
        full32 = activation_memory(recipe, batch, seq_len, dtype="fp32", device=device).layers
        recompute = max(sum(v for k, v in f.items() if k not in RESIDUAL_PARTS)
                        + sum(v for k, v in f32.items() if k in RESIDUAL_PARTS) + 2.0 * c - sum(kept.values())
                        for f, f32, c, kept in zip(full, full32, casts, layers))
    layer_copies = [2.0 * c for c in casts] if autocast and mode == "none" else [0.0] * len(layers)
    # gradient bytes per block: the precision's, sharded at ZeRO-2/3 over the data-parallel (experts: their) ranks
    per_param = states.grads / max(sharded_params, 1.0)
    grads = [per_param * (dense + experts / ep) for dense, experts in params]
    saved = [sum(layer.values()) for layer in layers]
    # backward runs the blocks last to first: after k blocks' backward their activations (and the weight
    # copies they saved) are gone and their gradients exist; with accumulation every gradient exists throughout
    base = sum(model_acts.values()) + recompute + _working_set(cfg, batch * seq_len, precision, autocast)
    base += copies - sum(layer_copies) if mode == "none" else 0.0  # the head's copy, freed last
    accumulated = states.grads if grad_accum > 1 else 0.0
    backward = max(base + sum(saved[:i]) + sum(layer_copies[:i])
                   + (accumulated if accumulated else sum(grads[i:])) for i in range(len(layers) + 1))
    forward_end = sum(model_acts.values()) + sum(saved) + copies + accumulated  # checkpointing: autocast's cache
    shard = launch.world if deepspeed and stage >= 1 else 1  # ZeRO partitions what the optimizer steps on
    # AdamW's kernel (archlab.optim.adamw.adamw_kernel): fused on CUDA, no temporaries; foreach elsewhere, an fp32
    # tensor the size of its largest parameter group (sqrt of v)
    step_temp = 0.0 if device == "cuda" else 4.0 * _largest_group(recipe, cfg, ep) / shard
    if deepspeed and precision == "bf16":  # the fp32 gradient partition the step builds
        step_temp += 4.0 * sharded_params / shard
    buckets = 4.0 * sharded_params if (not deepspeed and launch.world > 1) else 0.0
    regime = "autocast" if autocast else ("deepspeed bf16" if deepspeed and precision == "bf16" else precision)
    return MemoryPlan(regime=regime, weights=states.weights, grads=states.grads, optimizer=states.optimizer,
                      weight_copies=copies, grad_buckets=buckets,
                      activations=sum(model_acts.values()) + sum(saved) + recompute,
                      step_temp=step_temp, backward=max(backward, forward_end))


def _working_set(cfg, n: int, precision: str, autocast: bool) -> float:
    """What one block's backward holds beside the activations: the gradient of its widest output (the FFN's up
    projection: N x up_width x F, or the experts' on their routed slots) and of the residual stream (N x D;
    fp32 under autocast)."""
    act = 4 if precision == "fp32" else 2
    rows = 0.0
    if any(not cfg.is_moe_layer(i) for i in range(cfg.n_layers)):
        rows = float(n * cfg.ffn_hidden)
    if cfg.moe is not None:
        rows = max(rows, float(router_class(cfg).kept_slots(cfg.moe, n) * cfg.moe.expert_hidden))
    return rows * ffn_class(cfg).up_width * act + n * cfg.d_model * (4 if autocast else act)


def _largest_group(recipe, cfg, ep: int) -> float:
    """Parameters (this rank's: routed experts / ep) of AdamW's largest parameter group (decay, readout,
    no-decay: ``archlab.optim.adamw.adamw_param_groups``)."""
    model = build_model(cfg, device="meta")
    experts = {id(p) for m in model.modules() if hasattr(m, "w_up") for p in m.parameters(recurse=False)}
    groups = adamw_param_groups(model, float(_train(recipe, "weight_decay", 0.1)))
    return max(sum(p.numel() / (ep if id(p) in experts else 1) for p in g["params"]) for g in groups)


@dataclass(frozen=True)
class TrainingPlan:
    """The memory plan on a GPU model, and the time to the token budget at a stated MFU."""

    recipe: str
    launch: Launch
    gpu: Gpu
    memory: MemoryPlan
    headroom: float
    mfu: float
    flops_per_token: float
    tokens: float

    @property
    def usable_bytes(self) -> float:
        return self.gpu.memory_bytes * (1 - self.headroom)

    @property
    def fits(self) -> bool:
        return self.memory.peak <= self.usable_bytes

    @property
    def tokens_per_s(self) -> float:
        """All GPUs together: MFU x peak FLOP/s / training FLOPs per token."""
        return self.launch.world * self.mfu * self.gpu.peak_flops / self.flops_per_token

    @property
    def hours(self) -> float:
        return self.tokens / self.tokens_per_s / 3600

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.launch.world

    def as_dict(self) -> dict:
        return {"recipe": self.recipe, "launch": self.launch.describe(), "gpu": self.gpu.name,
                "gpu_memory_bytes": self.gpu.memory_bytes, "headroom": self.headroom, "fits": self.fits,
                "memory": self.memory.as_dict(), "regime": self.memory.regime, "mfu": self.mfu,
                "flops_per_token": self.flops_per_token, "tokens": self.tokens, "tokens_per_s": self.tokens_per_s,
                "hours": self.hours, "gpu_hours": self.gpu_hours}


def training_plan(recipe, launch: Launch = Launch(), gpu: str = "h100", mfu: float = 0.4, headroom: float = 0.1,
                  tokens: Optional[float] = None, **memory_kw) -> TrainingPlan:
    """:func:`memory_plan` on ``gpu`` (h100 | h200 | a100): fits within (1 - ``headroom``) of its memory
    (the rest: CUDA context, NCCL, allocator fragmentation), tokens/s at ``mfu``, hours to ``tokens``
    (default the recipe's budget: max_steps x micro_batch_size x grad_accum x GPUs x seq_len)."""
    if gpu not in GPUS:
        raise ValueError(f"gpu={gpu!r}: must be one of {', '.join(GPUS)}")
    if not (isinstance(mfu, (int, float)) and 0 < mfu <= 1):
        raise ValueError(f"mfu={mfu!r}: must be a fraction in (0, 1], e.g. 0.4")
    if not (isinstance(headroom, (int, float)) and 0 <= headroom < 1):
        raise ValueError(f"headroom={headroom!r}: must be a fraction in [0, 1), e.g. 0.1")
    memory = memory_plan(recipe, launch, **memory_kw)
    t = recipe.train
    seq_len = memory_kw.get("seq_len") or int(t.seq_len)
    if tokens is None:
        tokens = float(t.max_steps) * t.micro_batch_size * t.grad_accum * launch.world * seq_len
    elif not tokens > 0:
        raise ValueError(f"tokens={tokens!r}: must be positive")
    objective = objective_type(t.get("objective", "causal_lm"))
    fpt = float(training_flops_per_token(model_config(recipe), seq_len, objective))
    return TrainingPlan(recipe=str(recipe.get("name", "recipe")), launch=launch, gpu=GPUS[gpu], memory=memory,
                        headroom=headroom, mfu=float(mfu), flops_per_token=fpt, tokens=float(tokens))


def _fmt_count(x: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}"
    return f"{x:.3g}"


def format_plan(plan: TrainingPlan) -> str:
    """The plan as a few aligned lines."""
    m = plan.memory
    rows = [("weights", m.weights), ("gradients", m.grads), ("optimizer state", m.optimizer)]
    if m.weight_copies:
        rows.append(("bf16 weight copies (autocast)", m.weight_copies))
    if m.grad_buckets:
        rows.append(("DDP gradient buckets", m.grad_buckets))
    rows += [("activations (1 micro-batch)", m.activations), ("optimizer step temporaries", m.step_temp)]
    width = max(len(k) for k, _ in rows)
    fit = "fits" if plan.fits else "DOES NOT FIT"
    lines = [f"plan {plan.recipe}: {plan.launch.describe()}, {plan.gpu.name}, {m.regime}",
             *[f"  {k.ljust(width)}  {v / GiB:8.2f} GiB" for k, v in rows],
             f"  {'peak per GPU'.ljust(width)}  {m.peak / GiB:8.2f} GiB  ({fit}: {plan.usable_bytes / GiB:.1f} of "
             f"{plan.gpu.memory_bytes / GiB:.1f} GiB usable at {plan.headroom:.0%} headroom)",
             f"  throughput at {plan.mfu:.0%} MFU: {plan.tokens_per_s:,.0f} tokens/s "
             f"({plan.tokens_per_s / plan.launch.world:,.0f} per GPU; {_fmt_count(plan.flops_per_token)} FLOP/token, "
             f"{plan.gpu.peak_flops / 1e12:.0f} TFLOP/s bf16 peak)",
             f"  token budget {_fmt_count(plan.tokens)}: {plan.hours:,.1f} h wall, {plan.gpu_hours:,.0f} GPU-hours"]
    if not math.isfinite(plan.hours):
        lines[-1] = "  token budget: not computable"
    return "\n".join(lines)
