"""One Hugging Face family <-> archlab, both ways: the base class every adapter subclasses and the registry.

Shape legend: D model dim, H query heads, G key/value heads, Dh head dim.

An adapter (``archlab/hf/adapters/<family>.py``, registered under the HF ``model_type``) owns, for its family:

- what it expresses: ``expresses`` (recipe key -> the values its class has, e.g. ``norm.type: (layernorm,)``)
  and ``matches(cfg)``, None or the reason it cannot express an archlab ``ModelConfig`` exactly;
- the config both ways: ``to_hf_config(cfg)`` (a ``transformers`` config) and ``from_hf_config(config.json
  dict)`` (the recipe's ``model`` node), which refuses a key archlab cannot express by name;
- the tensors both ways: ``to_hf(model)`` (archlab weights under HF names and layouts) and ``from_hf(model,
  hf_sd)``. Every ``to_hf`` is an index map (rows split, transposed, permuted, repeated, zeros where archlab
  has no tensor), so ``from_hf`` is derived from it: ``to_hf`` is run once on a copy of the model whose
  entries hold their own index (:func:`trace_to_hf`), and each archlab entry is then read from the HF entry
  that carries its index. One mapping, written once, read both ways.

    @ADAPTERS.register("gpt2")
    class GPT2Adapter(HFAdapter):
        hf_class_name = "GPT2LMHeadModel"
        expresses = {"model.type": ("decoder",), "norm.type": ("layernorm",), ...}
        def to_hf_config(self, cfg): ...
        def from_hf_config(self, c: dict) -> dict: ...
        def to_hf(self, model) -> dict[str, Tensor]: ...
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Optional

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.nn.mup import width_mult
from archlab.nn.positions import position_class
from archlab.registry import Registry

ADAPTERS: Registry = Registry("hf adapter")

# Why a family that lacks an archlab variant cannot express it: (recipe key, value) -> reason.
WHY_NOT: dict[tuple[str, str], str] = {
    ("type", "decoder"): "a causal decoder (one stack): this family's class is an encoder or an encoder-decoder",
    ("type", "encoder"): ("an encoder (bidirectional attention): this family's class is a causal decoder or "
                          "an encoder-decoder"),
    ("type", "encoder_decoder"): "an encoder-decoder: this family's class has a single stack",
    ("attention.type", "mha"): ("full causal attention: this family's layers all use a sliding window or "
                                "latent attention"),
    ("attention.type", "mla"): "multi-head latent attention: only DeepSeek-V3 among the exported families has it",
    ("attention.type", "sliding_window"): ("sliding-window attention: only Mistral among the exported families "
                                           "has it"),
    ("norm.type", "layernorm"): "LayerNorm with a mean: this family uses RMSNorm",
    ("norm.type", "rmsnorm"): "RMSNorm: GPT-2 and BERT use LayerNorm (so do GPT-J and GPT-NeoX)",
    ("position.type", "none"): "no position encoding (NoPE): no Hugging Face class of this family has that",
    ("position.type", "learned"): "learned absolute positions: this family uses RoPE",
    ("position.type", "sinusoidal"): "sinusoidal positions: no Hugging Face decoder class of this family has them",
    ("position.type", "rope"): "RoPE: GPT-2 and BERT have learned absolute positions only",
    ("position.type", "alibi"): "ALiBi: no Hugging Face class of this family has linear attention biases",
    ("position.type", "relative"): "T5's relative position bias: no Hugging Face class of this family has it",
    ("position.rope_scaling.type", "ntk"): ("HF has no static NTK-aware RoPE (its 'dynamic' NTK changes the base "
                                            "with the sequence length, a different function)"),
    ("ffn.type", "gelu"): "a GELU MLP: this family's MLP is SwiGLU",
    ("ffn.type", "relu"): "a ReLU MLP: this family's MLP is SwiGLU or GELU",
    ("ffn.type", "swiglu"): ("SwiGLU: GPT-2's, GPT-J's, GPT-NeoX's and BERT's MLP is up-activation-down "
                             "(gelu, relu), not gated"),
    ("block.type", "sequential"): "sequential attention then FFN: this family's layer runs them in parallel",
    ("block.type", "parallel"): "the parallel block: this family's layers run attention, then the FFN",
    ("moe.router.type", "softmax_topk"): "DeepSeek-V3's router is sigmoid top-k (sigmoid_topk)",
    ("moe.router.type", "sigmoid_topk"): "the HF router is softmax top-k",
    ("moe.router.type", "expert_choice"): "expert-choice routing: no Hugging Face model routes tokens this way",
}
WHY_NOT_DEFAULT = "no Hugging Face class of this family has it"

# archlab's RoPE scalings -> HF rope_type, and back
ROPE_TYPES = {"none": "default", "linear": "linear", "yarn": "yarn"}
# archlab's GELU forms (ffn.approximate) -> the HF activation name an export writes, and HF's names -> the form
GELU_HF_NAME = {"tanh": "gelu_new", "none": "gelu"}
GELU_FROM_HF = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}


class HFAdapter:
    """One Hugging Face family <-> archlab (see the module docstring)."""

    hf_class_name: ClassVar[str] = ""  # attribute of the ``transformers`` module, e.g. "LlamaForCausalLM"
    tied_head_key: ClassVar[str] = "lm_head.weight"  # left to ``tie_weights`` when tied to the embedding
    expresses: ClassVar[dict[str, tuple[str, ...]]] = {}  # recipe key (under model.) -> values it has
    family: ClassVar[str] = ""  # its registry name: the HF ``model_type``

    # -- what it expresses
    def matches(self, cfg: ModelConfig) -> Optional[str]:
        """None when this family expresses ``cfg`` exactly, else the reason it cannot."""
        return component_reasons(cfg, self.expresses)

    # -- config both ways
    def to_hf_config(self, cfg: ModelConfig):
        """The ``transformers`` config of the same architecture."""
        raise NotImplementedError

    def from_hf_config(self, c: dict) -> dict:
        """The recipe's ``model`` node for an HF ``config.json`` (a dict); ConfigRefused names a key it
        cannot express."""
        raise NotImplementedError

    # -- tensors both ways
    def to_hf(self, model) -> dict[str, Tensor]:
        """archlab weights under the HF class's parameter names and layouts."""
        raise NotImplementedError

    def prepare_hf(self, hf_sd: dict[str, Tensor], c: dict) -> dict[str, Tensor]:
        """HF tensors folded into what ``to_hf`` writes (e.g. BERT's token-type row into the position
        table); by default unchanged."""
        return hf_sd

    def finish_hf(self, sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """``to_hf``'s tensors as the HF class stores them where that is not an index map (Qwen3-Next's
        zero-centred norms hold w - 1), undone by ``prepare_hf`` on import; by default unchanged."""
        return sd

    def from_hf(self, model, hf_sd: dict[str, Tensor]) -> None:
        """Fill ``model``'s tensors from the HF state dict ``hf_sd`` through the inverse of ``to_hf``."""
        tensors = unique_tensors(model)
        sources = trace_to_hf(self, model)
        unused = sorted(set(hf_sd) - set(sources) - {self.tied_head_key})  # a tied head: the embedding
        if unused:
            raise ValueError(f"{self.hf_class_name}: archlab has no tensor for {', '.join(unused[:6])}"
                             + (f" (+{len(unused) - 6} more)" if len(unused) > 6 else ""))
        offsets = _offsets(tensors)
        total = sum(hi - lo for lo, hi in offsets.values())
        flat = torch.full((total,), float("nan"), dtype=torch.float64)  # every archlab entry, in tensor order
        for key, idx in sources.items():
            if key not in hf_sd:  # e.g. a tied head: its entries are the embedding's
                continue
            value = hf_sd[key].detach().to(torch.float64)
            if value.shape != idx.shape:
                raise ValueError(f"{key}: shape {tuple(value.shape)} in the checkpoint, {tuple(idx.shape)} expected")
            holes = idx == 0
            if bool((value[holes] != 0).any()):
                raise ValueError(f"{key}: nonzero entries where archlab has no parameter (e.g. a bias it lacks); "
                                 "archlab cannot express them")
            flat[idx[~holes].long() - 1] = value[~holes]
        unread = [n for n, (lo, hi) in offsets.items() if bool(torch.isnan(flat[lo:hi]).any())]
        if unread:
            absent = sorted(set(sources) - set(hf_sd))
            raise ValueError(f"{self.hf_class_name}: no checkpoint tensor holds archlab's {', '.join(unread)} "
                             f"(absent from the checkpoint: {', '.join(absent) or 'none'})")
        with torch.no_grad():
            for name, t in tensors.items():
                lo, hi = offsets[name]
                t.copy_(flat[lo:hi].view_as(t).to(t.dtype))

    def hf_class(self):
        import transformers

        return getattr(transformers, self.hf_class_name)


def find_adapter(cfg: ModelConfig) -> HFAdapter:
    """The first registered adapter that expresses ``cfg``; ValueError with every reason if none."""
    reasons = []
    for name in ADAPTERS.names():
        adapter = ADAPTERS.get(name)()
        why = adapter.matches(cfg)
        if why is None:
            return adapter
        reasons.append(f"  {name} ({adapter.hf_class_name}): {why}")
    raise ValueError("no Hugging Face class can express this model exactly:\n" + "\n".join(reasons))


class ConfigRefused(ValueError):
    """A config.json key archlab cannot express: the message names the key, its value and what archlab has."""


def refuse(key: str, value: Any, supported: str) -> ConfigRefused:
    return ConfigRefused(f"config.json: {key}={value!r}: archlab supports {supported}")


# ----------------------------------------------------------------------------- what a family expresses


def component_reasons(cfg: ModelConfig, expresses: dict[str, tuple[str, ...]]) -> Optional[str]:
    """None when every component of ``cfg`` is one ``expresses`` lists, else the first one's reason."""
    if cfg.scale_embeddings:  # a decoder-level fact every exported family shares
        return "scale_embeddings=true: this class does not multiply the token embedding by sqrt(d_model)"
    pattern = getattr(getattr(cfg, "layers", None), "pattern", None)
    if pattern:  # a hybrid stack: per-layer attention variants
        return f"layers.pattern={list(pattern)}: this class has the same attention in every layer"
    if getattr(cfg.attention, "output_gate", False):  # mha's gate: only Qwen3-Next's full attention has it
        return "attention.output_gate=true: this class does not gate the attention output (Qwen3-Next does)"
    fraction = getattr(cfg.attention, "rotary_fraction", 1.0)
    if fraction != 1.0 and position_class(cfg).rotates_qk:
        return f"attention.rotary_fraction={fraction}: this class rotates the whole head (Qwen3-Next rotates a part)"
    keys = ["type", "attention.type", "norm.type", "position.type", "ffn.type", "block.type"]
    if position_class(cfg).rotates_qk:
        keys.append("position.rope_scaling.type")
    if cfg.moe is not None:
        keys.append("moe.router.type")
    for key in keys:
        value = _read(cfg, key)
        if key in expresses and value not in expresses[key]:
            what = f"model.type={value}" if key == "type" else f"{key}={value}"
            return f"{what}: {WHY_NOT.get((key, value), WHY_NOT_DEFAULT)}"
    return None


def _read(cfg: Any, key: str) -> Any:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def common_reasons(cfg: ModelConfig) -> Optional[str]:
    """The checks every dense pre-LN decoder family shares."""
    if cfg.moe is not None:
        return "it has MoE layers (dense families only)"
    if cfg.norm.placement != "pre":
        return f"norm.placement={cfg.norm.placement}: HF decoders are pre-LN"
    if getattr(cfg.attention, "qk_norm", False):  # an mha key (another variant: its own reason)
        return "attention.qk_norm=true: this class has no q/k norm"
    if cfg.attention.scale is not None:
        return f"attention.scale={cfg.attention.scale}: this class always scales scores by 1/sqrt(d_head)"
    return mup_reason(cfg)


def mup_reason(cfg: ModelConfig) -> Optional[str]:
    if width_mult(cfg) != 1.0:  # muP at m = 1 is standard parametrisation exactly
        return (f"parametrization=mup at width multiplier {width_mult(cfg):g}: HF has no field for muP's "
                "readout multiplier (logits / m) or its 1/(sqrt(d_head) * sqrt(m)) attention scale")
    return None


# ----------------------------------------------------------------------------- config helpers


def rope_parameters(cfg: ModelConfig) -> dict:
    """HF ``rope_parameters`` of archlab's RoPE: rope_type, rope_theta and the scaling's entries."""
    sc = cfg.position.rope_scaling
    params = {"rope_type": ROPE_TYPES[sc.type], "rope_theta": cfg.position.rope_base}
    if sc.type in ("linear", "yarn"):
        params["factor"] = sc.factor
    if sc.type == "yarn":
        params.update(original_max_position_embeddings=sc.original_max_seq_len or cfg.max_seq_len,
                      beta_fast=sc.beta_fast, beta_slow=sc.beta_slow)
    return params


def rope_from_hf(c: dict, extra_ok: tuple[str, ...] = ()) -> dict:
    """archlab's ``position`` node (RoPE) from an HF config's ``rope_parameters`` (or the older
    ``rope_theta`` / ``rope_scaling``); an HF rope_type archlab lacks is refused by name."""
    params = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    back = {v: k for k, v in ROPE_TYPES.items()}
    if kind not in back:
        raise refuse("rope_parameters.rope_type", kind, "default, linear and yarn (archlab's RoPE scalings)")
    sc: dict = {"type": back[kind]}
    if kind in ("linear", "yarn"):
        sc["factor"] = float(params["factor"])
    if kind == "yarn":
        for key in params:
            if key in ("mscale", "mscale_all_dim", "attention_factor", "truncate") and key not in extra_ok \
                    and params[key] not in (None, 1.0, 1, True):
                raise refuse(f"rope_parameters.{key}", params[key], "YaRN's default temperature only")
        sc.update(original_max_seq_len=int(params.get("original_max_position_embeddings")
                                           or c["max_position_embeddings"]),
                  beta_fast=float(params.get("beta_fast", 32.0)), beta_slow=float(params.get("beta_slow", 1.0)))
    return {"type": "rope", "rope_base": float(theta), "rope_scaling": sc}


def hf_activation(cfg: ModelConfig) -> str:
    """The HF activation name of archlab's GELU (either form) or ReLU MLP."""
    return GELU_HF_NAME[cfg.ffn.approximate] if cfg.ffn.type == "gelu" else "relu"


def gelu_or_relu(c: dict, key: str) -> dict:
    """archlab's ``ffn`` node (``type``, and ``approximate`` for a GELU) for the HF activation name ``c[key]``."""
    act = c.get(key)
    if act in GELU_FROM_HF:
        return {"type": "gelu", "approximate": GELU_FROM_HF[act]}
    if act == "relu":
        return {"type": "relu"}
    raise refuse(key, act, "gelu_new / gelu_pytorch_tanh (GELU, tanh approximation), gelu (exact GELU, erf) "
                 "and relu")


def require(c: dict, key: str, allowed: tuple, supported: str) -> None:
    """Refuse ``c[key]`` unless it is one of ``allowed``."""
    if c.get(key) not in allowed:
        raise refuse(key, c.get(key), supported)


def dense_decoder_node(c: dict, *, d_model: str, n_layers: str, n_heads: str, max_seq_len: str, eps: str) -> dict:
    """The size keys of the recipe's ``model`` node, read under the family's HF names."""
    node = {"vocab_size": int(c["vocab_size"]), "d_model": int(c[d_model]), "n_layers": int(c[n_layers]),
            "n_heads": int(c[n_heads]), "max_seq_len": int(c[max_seq_len]),
            "tie_embeddings": bool(c.get("tie_word_embeddings", True)),
            "init_std": float(c.get("initializer_range", 0.02))}
    node["norm"] = {"eps": float(c.get(eps, 1e-5))}
    return node


# ----------------------------------------------------------------------------- tensor helpers


def split_qkv(wqkv: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Fused [q; k; v] rows (or bias entries) -> q (H*Dh, ...), k (G*Dh, ...), v (G*Dh, ...)."""
    h, g, dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
    return wqkv.split([h * dh, g * dh, g * dh], dim=0)


def expand_kv(t: Tensor, cfg: ModelConfig) -> Tensor:
    """K or V rows of G heads -> rows of H heads, each KV head repeated for its H/G query heads
    (the sharing archlab's attention does), so an MHA-only class computes the same attention."""
    rep = cfg.n_heads // cfg.kv_heads
    return t.reshape(cfg.kv_heads, cfg.d_head, *t.shape[1:]).repeat_interleave(rep, dim=0).flatten(0, 1)


def mha_rows(t: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Fused [q; k; v] rows (or bias entries) -> q, k, v of H heads each (G key/value heads repeated)."""
    q, k, v = split_qkv(t, cfg)
    return q, expand_kv(k, cfg), expand_kv(v, cfg)


def layernorm_sd(prefix: str, norm) -> dict[str, Tensor]:
    """A norm's weight and bias (zeros for a norm without one)."""
    bias = norm.bias if getattr(norm, "bias", None) is not None else torch.zeros_like(norm.weight)
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": bias}


def linear_sd(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    """nn.Linear -> weight, and bias when it has one."""
    sd = {f"{prefix}.weight": linear.weight}
    if linear.bias is not None:
        sd[f"{prefix}.bias"] = linear.bias
    return sd


def linear_with_bias_sd(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    """nn.Linear -> weight and bias (zeros for a missing bias, for a class whose layers all have one)."""
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
    return {f"{prefix}.weight": linear.weight, f"{prefix}.bias": bias}


# ----------------------------------------------------------------------------- the inverse of to_hf


def unique_tensors(model) -> dict[str, Tensor]:
    """The model's stored tensors (parameters and persistent buffers), a tied one under its first name."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if id(t) in seen or t.data_ptr() in seen:
            continue
        seen.update({id(t), t.data_ptr()})
        out[name] = t
    return out


def _offsets(tensors: dict[str, Tensor]) -> dict[str, tuple[int, int]]:
    out, lo = {}, 0
    for name, t in tensors.items():
        out[name] = (lo, lo + t.numel())
        lo += t.numel()
    return out


def trace_to_hf(adapter: HFAdapter, model) -> dict[str, Tensor]:
    """``adapter.to_hf`` applied to a float64 copy of ``model`` whose entries are numbered 1, 2, ...
    (0: an entry ``to_hf`` writes as zero). Each HF tensor then holds, per entry, the archlab entry it is."""
    traced = copy.deepcopy(model).to(torch.float64)
    tensors = unique_tensors(traced)
    with torch.no_grad():
        for name, (lo, hi) in _offsets(tensors).items():
            tensors[name].copy_(torch.arange(lo + 1, hi + 1, dtype=torch.float64).view_as(tensors[name]))
        sd = {k: v.detach().clone() for k, v in adapter.to_hf(traced).items()}
    for key, v in sd.items():
        if not bool((v == v.round()).all()):
            raise RuntimeError(f"{type(adapter).__name__}.to_hf: {key} is not an index map of archlab's tensors "
                               "(scaled or mixed); it cannot be inverted")
    return sd
