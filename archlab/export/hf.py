"""Export a dense archlab decoder to a Hugging Face ``transformers`` model folder.

Shape legend: D model dim, H query heads, G key/value heads, Dh head dim, F ffn hidden dim,
V vocabulary.

An exporter maps one architecture family onto one HF class. Exporters live in one registry and
are chosen by architecture (norm, positions, ffn, ...), never by recipe name:

    @EXPORTERS.register("gpt2")
    class GPT2Exporter(HFExporter):
        hf_class_name = "GPT2LMHeadModel"
        def matches(self, cfg) -> Optional[str]: ...     # None, or why this family cannot express cfg
        def hf_config(self, cfg) -> PretrainedConfig: ...
        def state_dict(self, model) -> dict[str, Tensor]: ...

Adding a family (e.g. Mixtral in ``archlab/export/mixtral.py``) is one such class; importing its
module registers it. ``find_exporter`` tries them all and, when none fits, raises a ValueError
listing each family's reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor

from archlab.config.schema import ModelConfig
from archlab.model.build import model_class
from archlab.model.decoder import Decoder, block_type
from archlab.nn.attention import attention_class
from archlab.nn.ffn import ffn_class
from archlab.nn.mup import width_mult
from archlab.nn.norms import norm_class
from archlab.nn.positions import ROPE_SCALINGS, position_class
from archlab.registry import Registry

EXPORTERS: Registry = Registry("hf exporter")


class HFExporter:
    """One architecture family -> one ``transformers`` causal-LM (or, for an encoder, masked-LM) class."""

    hf_class_name: str = ""  # attribute of the ``transformers`` module, e.g. "LlamaForCausalLM"
    tied_head_key: str = "lm_head.weight"  # the head's weight, left to ``tie_weights`` when tied to the embedding

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        """None when this family expresses ``cfg`` exactly, else the reason it cannot."""
        raise NotImplementedError

    def hf_config(self, cfg: ModelConfig):
        """The ``transformers`` config of the same architecture."""
        raise NotImplementedError

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        """archlab weights under the HF class's parameter names and layouts."""
        raise NotImplementedError

    def hf_class(self):
        import transformers

        return getattr(transformers, self.hf_class_name)


def find_exporter(cfg: ModelConfig) -> HFExporter:
    """The first registered exporter that expresses ``cfg``; ValueError with every reason if none."""
    reasons = []
    for name in EXPORTERS.names():
        exporter = EXPORTERS.get(name)()
        why = exporter.matches(cfg)
        if why is None:
            return exporter
        reasons.append(f"  {name} ({exporter.hf_class_name}): {why}")
    raise ValueError("no Hugging Face class can express this model exactly:\n" + "\n".join(reasons))


def to_hf_model(model: Decoder, eos_id: Optional[int] = None):
    """An HF model (fp32, eval mode) holding ``model``'s weights; its logits equal archlab's.

    archlab has one special token, end-of-text; ``eos_id`` (when known) is both HF's bos and eos.
    """
    exporter = find_exporter(model.cfg)
    config = exporter.hf_config(model.cfg)
    config.bos_token_id = config.eos_token_id = eos_id
    config.pad_token_id = None
    hf = exporter.hf_class()(config).float()
    sd = {k: v.detach().float().contiguous() for k, v in exporter.state_dict(model).items()}
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (k == exporter.tied_head_key and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"{exporter.hf_class_name} state dict mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def export_hf(
    model: Decoder,
    out_dir: Union[str, Path],
    tokenizer_file: Optional[Union[str, Path]] = None,
    eos_id: Optional[int] = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a folder that ``AutoModelForCausalLM.from_pretrained`` loads (an encoder:
    ``AutoModelForMaskedLM``).

    Weights go through ``save_pretrained`` (safetensors). With ``tokenizer_file`` (a ``tokenizers``
    JSON), the folder also gets a fast tokenizer. The folder is written next to ``out_dir`` and
    renamed into place, so a crash never leaves half a model under that name.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another folder or pass overwrite=True (--force)")
    hf = to_hf_model(model, eos_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf.save_pretrained(tmp)
        if tokenizer_file is not None:
            _save_tokenizer(Path(tokenizer_file), tmp, eos_id)
        _default_permissions(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            shutil.rmtree(old)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _default_permissions(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; give it and its files the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for f in folder.iterdir():
        os.chmod(f, 0o666 & ~umask)


def _save_tokenizer(tokenizer_file: Path, folder: Path, eos_id: Optional[int]) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    if eos_id is not None:
        tok.eos_token = tok.convert_ids_to_tokens(eos_id)
    tok.save_pretrained(folder)


# ----------------------------------------------------------------------------- shared checks


def component_reasons(cfg: ModelConfig, family: str) -> Optional[str]:
    """None when every component of ``cfg`` says the HF ``family`` expresses it (their
    ``hf_export``), else the first component's reason (``archlab.nn.component.Exportable``)."""
    if cfg.scale_embeddings:  # a decoder-level fact every exported family shares
        return "scale_embeddings=true: this class does not multiply the token embedding by sqrt(d_model)"
    parts = [(f"model.type={cfg.type}", model_class(cfg)),
             (f"attention.type={cfg.attention.type}", attention_class(cfg)),
             (f"norm.type={cfg.norm.type}", norm_class(cfg)),
             (f"position.type={cfg.position.type}", position_class(cfg)),
             (f"ffn.type={cfg.ffn.type}", ffn_class(cfg)),
             (f"block.type={cfg.block.type}", block_type(cfg))]
    if position_class(cfg).rotates_qk:
        sc = cfg.position.rope_scaling.type
        parts.append((f"position.rope_scaling.type={sc}", ROPE_SCALINGS.get(sc)))
    for what, component in parts:
        why = component.export_reason(family, what)
        if why is not None:
            return why
    return None


def _common_reasons(cfg: ModelConfig) -> Optional[str]:
    if cfg.moe is not None:
        return "it has MoE layers (dense families only)"
    if cfg.norm.placement != "pre":
        return f"norm.placement={cfg.norm.placement}: HF decoders are pre-LN"
    if cfg.attention.qk_norm:
        return "attention.qk_norm=true: this class has no per-head q/k norm"
    if cfg.attention.scale is not None:
        return f"attention.scale={cfg.attention.scale}: this class always scales scores by 1/sqrt(d_head)"
    if width_mult(cfg) != 1.0:  # muP at m = 1 is standard parametrisation exactly
        return (f"parametrization=mup at width multiplier {width_mult(cfg):g}: HF has no field for muP's "
                "readout multiplier (logits / m) or its 1/(sqrt(d_head) * sqrt(m)) attention scale")
    return None


def _split_qkv(wqkv: Tensor, cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    """Fused [q; k; v] rows (or bias entries) -> q (H*Dh, ...), k (G*Dh, ...), v (G*Dh, ...)."""
    h, g, dh = cfg.n_heads, cfg.kv_heads, cfg.d_head
    return wqkv.split([h * dh, g * dh, g * dh], dim=0)


def _expand_kv(t: Tensor, cfg: ModelConfig) -> Tensor:
    """K or V rows of G heads -> rows of H heads, each KV head repeated for its H/G query heads
    (the sharing archlab's attention does), so an MHA-only class computes the same attention."""
    rep = cfg.n_heads // cfg.kv_heads
    return t.reshape(cfg.kv_heads, cfg.d_head, *t.shape[1:]).repeat_interleave(rep, dim=0).flatten(0, 1)


# ----------------------------------------------------------------------------- GPT-2


@EXPORTERS.register("gpt2")
class GPT2Exporter(HFExporter):
    """GPT-2/3-style: pre-LN LayerNorm, learned positions, GELU(tanh)/ReLU MLP -> GPT2LMHeadModel.

    GPT-2 has MHA only: GQA/MQA key/value heads are repeated into H heads (exact, larger).
    GPT-2 always has biases: a bias archlab does not have is written as zeros (exact).
    GPT-2's Conv1D stores weights as (in, out): archlab's (out, in) Linear weights are transposed.
    """

    hf_class_name = "GPT2LMHeadModel"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return component_reasons(cfg, "gpt2") or _common_reasons(cfg)

    def hf_config(self, cfg: ModelConfig):
        from transformers import GPT2Config

        return GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.max_seq_len, n_embd=cfg.d_model,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.ffn_hidden,
            activation_function=ffn_class(cfg).hf_export["gpt2"], layer_norm_epsilon=cfg.norm.eps,
            resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.attention.dropout,
            initializer_range=cfg.init_std, tie_word_embeddings=cfg.tie_embeddings, use_cache=True,
            bos_token_id=None, eos_token_id=None,  # GPT-2's 50256 may lie outside this vocabulary
        )

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        cfg = model.cfg
        sd = {
            "transformer.wte.weight": model.embed.weight,
            "transformer.wpe.weight": model.positions.table.weight,
            "lm_head.weight": model.lm_head.weight,
        }
        sd.update(_layernorm("transformer.ln_f", model.final_norm))
        for i, blk in enumerate(model.blocks):
            p = f"transformer.h.{i}"
            sd.update(_layernorm(f"{p}.ln_1", blk.attn_norm))
            sd.update(_layernorm(f"{p}.ln_2", blk.ffn_norm))
            q, k, v = _split_qkv(blk.attn.wqkv.weight, cfg)  # (out, D) rows
            sd[f"{p}.attn.c_attn.weight"] = torch.cat([q, _expand_kv(k, cfg), _expand_kv(v, cfg)]).T
            sd[f"{p}.attn.c_attn.bias"] = self._qkv_bias(blk.attn.wqkv, cfg)
            sd.update(_conv1d(f"{p}.attn.c_proj", blk.attn.wo))
            sd.update(_conv1d(f"{p}.mlp.c_fc", blk.ffn.up))
            sd.update(_conv1d(f"{p}.mlp.c_proj", blk.ffn.down))
        return sd

    @staticmethod
    def _qkv_bias(wqkv: torch.nn.Linear, cfg: ModelConfig) -> Tensor:
        if wqkv.bias is None:
            return wqkv.weight.new_zeros(3 * cfg.d_model)
        q, k, v = _split_qkv(wqkv.bias, cfg)
        return torch.cat([q, _expand_kv(k, cfg), _expand_kv(v, cfg)])


def _layernorm(prefix: str, norm: torch.nn.LayerNorm) -> dict[str, Tensor]:
    bias = norm.bias if norm.bias is not None else torch.zeros_like(norm.weight)
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": bias}


def _conv1d(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    """nn.Linear (out, in) -> HF Conv1D (in, out); a missing bias becomes zeros."""
    bias = linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
    return {f"{prefix}.weight": linear.weight.T, f"{prefix}.bias": bias}


# ----------------------------------------------------------------------------- LLaMA


def llama_config_kwargs(cfg: ModelConfig, rope_parameters: dict) -> dict:
    """The config fields every LLaMA-layout HF class (Llama, Mistral, Mixtral, Qwen3-MoE) shares."""
    return dict(
        vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.kv_heads, head_dim=cfg.d_head, hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm.eps, rope_parameters=rope_parameters,
        attention_dropout=cfg.attention.dropout, initializer_range=cfg.init_std,
        tie_word_embeddings=cfg.tie_embeddings, use_cache=True,
    )


def llama_layout_sd(model: Decoder, block_sd) -> dict[str, Tensor]:
    """The LLaMA layout's tensors: embedding, final norm, head and each layer's two norms, plus
    ``block_sd(prefix, block)`` for the layer's attention and MLP (``prefix`` = ``model.layers.i``)."""
    sd = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.final_norm.weight,
          "lm_head.weight": model.lm_head.weight}
    for i, blk in enumerate(model.blocks):
        p = f"model.layers.{i}"
        sd[f"{p}.input_layernorm.weight"] = blk.attn_norm.weight
        sd[f"{p}.post_attention_layernorm.weight"] = blk.ffn_norm.weight
        sd.update(block_sd(p, blk))
    return sd


def llama_attention_sd(prefix: str, blk, cfg: ModelConfig) -> dict[str, Tensor]:
    """Fused ``wqkv`` rows (and bias entries) -> q/k/v_proj, ``wo`` -> o_proj."""
    sd: dict[str, Tensor] = {}
    for name, t in (("weight", blk.attn.wqkv.weight), ("bias", blk.attn.wqkv.bias)):
        if t is not None:
            q, k, v = _split_qkv(t, cfg)
            sd.update({f"{prefix}.q_proj.{name}": q, f"{prefix}.k_proj.{name}": k, f"{prefix}.v_proj.{name}": v})
    sd.update(_linear(f"{prefix}.o_proj", blk.attn.wo))
    return sd


def swiglu_mlp_sd(prefix: str, ffn) -> dict[str, Tensor]:
    """A SwiGLU FFN (``gate_up`` rows [gate ; up], biases if any) -> gate_proj / up_proj / down_proj."""
    sd: dict[str, Tensor] = {}
    for name, t in (("weight", ffn.gate_up.weight), ("bias", ffn.gate_up.bias)):
        if t is not None:
            gate, up = t.chunk(2, dim=0)
            sd.update({f"{prefix}.gate_proj.{name}": gate, f"{prefix}.up_proj.{name}": up})
    sd.update(_linear(f"{prefix}.down_proj", ffn.down))
    return sd


@EXPORTERS.register("llama")
class LlamaExporter(HFExporter):
    """LLaMA-style: pre-LN RMSNorm, RoPE (none|linear|yarn scaling), SwiGLU, GQA -> LlamaForCausalLM.

    Fused ``wqkv`` rows split into q/k/v_proj, fused ``gate_up`` rows into gate/up_proj.
    Biases map onto HF's ``attention_bias`` / ``mlp_bias``.
    """

    hf_class_name = "LlamaForCausalLM"
    family = "llama"

    def matches(self, cfg: ModelConfig) -> Optional[str]:
        return component_reasons(cfg, self.family) or _common_reasons(cfg)

    def hf_config(self, cfg: ModelConfig):
        from transformers import LlamaConfig

        return LlamaConfig(**llama_config_kwargs(cfg, self.rope_parameters(cfg)), intermediate_size=cfg.ffn_hidden,
                           attention_bias=cfg.attention.bias, mlp_bias=cfg.ffn.bias)

    def rope_parameters(self, cfg: ModelConfig) -> dict:
        """HF ``rope_parameters``: the scaling class names its rope_type and extra entries."""
        pos, sc = cfg.position, cfg.position.rope_scaling
        scaling = ROPE_SCALINGS.get(sc.type)
        return {"rope_type": scaling.hf_export[self.family], "rope_theta": pos.rope_base,
                **scaling.hf_parameters(sc, cfg.max_seq_len)}

    def state_dict(self, model: Decoder) -> dict[str, Tensor]:
        return llama_layout_sd(model, lambda p, blk: {**llama_attention_sd(f"{p}.self_attn", blk, model.cfg),
                                                      **swiglu_mlp_sd(f"{p}.mlp", blk.ffn)})


def _linear(prefix: str, linear: torch.nn.Linear) -> dict[str, Tensor]:
    sd = {f"{prefix}.weight": linear.weight}
    if linear.bias is not None:
        sd[f"{prefix}.bias"] = linear.bias
    return sd
