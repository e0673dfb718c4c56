"""Matmul FLOPs per token from the config alone, by component.

Shape legend: S sequence length, D model dim, H query heads, G key/value heads, Dh head dim,
F ffn hidden dim, E routed experts, K experts per token, V vocabulary.

Conventions (the ones ``torch.utils.flop_counter.FlopCounterMode`` uses, so that the estimate
can be checked against a measured count):

- Only matrix multiplications count, 2 FLOPs per multiply-accumulate. Biases, norms, RoPE,
  softmax, activations, the embedding lookup and the loss are elementwise and count zero
  (Chinchilla's Appendix F adds softmax and the embedding; they are < 1% at these shapes).
- Each attention variant counts its own work (``forward_flops`` of its class); full attention
  counts the FULL S x S square: QK^T is 2*S*Dh FLOPs per token per head, and so is
  the weighted sum of V. Causal masking does not remove work from SDPA's math kernel, and the
  PaLM/Chinchilla/Kaplan formulas count the square too. The useful (unmasked) part is
  (S+1)/(2S) of it: ``FlopsBreakdown.attention_causal_useful`` reports it separately; it is
  never added to the total. An encoder (bidirectional attention) uses the whole square.
- A training step costs 3x the forward: the backward of every matmul is two matmuls of the
  same size (grad wrt input and grad wrt weight).
- MoE layers count what a token actually uses: its K routed experts, the shared experts and
  the router projection (2*D*E), never the experts it was not sent to.
- An encoder-decoder counts per text token of the window (the trainer's tokens): the encoder on its
  input ids, the decoder on its targets, cross-attention and the LM head on the targets, all divided
  by the window length (:func:`encoder_decoder_flops`). The model type's class states its structure
  (``stacks``, ``causal``); the cost model composes the count (:data:`COMPOSE`, one composition per
  number of stacks) from the components' own counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from omegaconf import DictConfig

from archlab.config.schema import ModelConfig, model_config
from archlab.model import model_class
from archlab.nn.attention import attention_class
from archlab.nn.attention.cross import CrossAttention
from archlab.nn.ffn import ffn_class
from archlab.nn.moe.layer import MoELayer
from archlab.objectives import objective_class, objective_name
from archlab.objectives.span_corruption import SpanCorruptionConfig, span_counts

BACKWARD_TO_FORWARD = 2.0  # backward = grad wrt input + grad wrt weight, each one forward matmul


@dataclass(frozen=True)
class FlopsBreakdown:
    """Forward matmul FLOPs per token, by component, summed over all layers."""

    qkv_proj: float  # the input projections (fused Q, K, V; MLA: its low-rank down/up projections)
    out_proj: float  # attention output projection
    attn_scores: float  # Q K^T, full S x S square
    attn_values: float  # softmax(.) V, full S x S square
    mlp: float  # dense FFN layers
    experts: float  # MoE layers: K routed + shared experts a token goes through
    router: float  # MoE router projection D -> E
    lm_head: float  # D -> V logits
    seq_len: int
    mtp: float = 0.0  # multi-token prediction (objective mtp): its modules' projections, blocks and head calls
    head_transform: float = 0.0  # an encoder's MLM head transform (BERT): dense D -> D before the LM head
    cross_attention: float = 0.0  # an encoder-decoder's cross-attention: projections (K/V of the memory) and core
    causal: bool = True  # the attention is causal (a decoder); an encoder's uses the whole square

    @property
    def total(self) -> float:
        return sum(v for k, v in self.components().items())

    @property
    def attention(self) -> float:
        """Scores + weighted sum, the full square."""
        return self.attn_scores + self.attn_values

    @property
    def attention_causal_useful(self) -> float:
        """The part of :attr:`attention` not masked out by causality: (S+1)/(2S) of the square for a
        decoder; all of it for an encoder, which masks nothing."""
        if not self.causal:
            return self.attention
        return self.attention * (self.seq_len + 1) / (2 * self.seq_len)

    def components(self) -> dict[str, float]:
        """Component name -> forward FLOPs per token; the values sum to :attr:`total`."""
        d = asdict(self)
        d.pop("seq_len")
        d.pop("causal")
        return d

    def scaled(self, factor: float) -> "FlopsBreakdown":
        """The same breakdown times ``factor`` (3 for a training step)."""
        return FlopsBreakdown(**{k: v * factor for k, v in self.components().items()}, seq_len=self.seq_len,
                              causal=self.causal)


def ffn_flops(cfg: ModelConfig, hidden: int) -> float:
    """Forward FLOPs per token of one FFN of ``ffn.type`` and width ``hidden`` (the FFN class says)."""
    return ffn_class(cfg).forward_flops(d_model=cfg.d_model, hidden=hidden)


def moe_layer_flops(cfg: ModelConfig) -> tuple[float, float]:
    """(experts, router) FLOPs per token of one MoE layer (the layer says: ``MoELayer.forward_flops``)."""
    return MoELayer.forward_flops(cfg)


def forward_flops(model_cfg, seq_len: int, objective: str | None = None) -> FlopsBreakdown:
    """Forward matmul FLOPs per token at context ``seq_len``, by component.

    ``model_cfg``: a ``ModelConfig`` (``archlab.model_config(recipe)``) or a recipe. ``objective``: the
    training objective whose head and loss count (``archlab.objectives``; default: a recipe's
    ``train.objective``, else ``mtp`` for a model with MTP modules, else ``causal_lm``).
    """
    name = objective_name(model_cfg, objective)
    head = objective_class(name).forward_flops
    cfg = model_config(model_cfg)
    if seq_len <= 0:
        raise ValueError(f"seq_len={seq_len}: must be a positive number of tokens")
    # the model type's stacks, composed here; the objective's head (the LM head, and what only the objective
    # runs, e.g. MTP modules) is counted per token the head sees
    model = model_class(cfg)
    return COMPOSE[model.stacks](model_cfg, cfg, seq_len, head(cfg, seq_len), model.causal)


ATTENTION_KEYS = ("qkv_proj", "out_proj", "attn_scores", "attn_values")


def stack_flops(model_cfg, cfg: ModelConfig, seq_len: int, head: dict, causal: bool) -> FlopsBreakdown:
    """One stack of ``n_layers`` blocks (a decoder or an encoder) at context ``seq_len``, per token; ``head``:
    the objective's head FLOPs per token. Every attention variant, FFN and MoE layer counts its own."""
    L = cfg.n_layers
    per_layer = [attention_class(cfg, i).forward_flops(cfg, seq_len, layer=i) for i in range(L)]  # each variant's count
    attn = {k: sum(f[k] for f in per_layer) for k in ATTENTION_KEYS}
    n_moe = sum(cfg.is_moe_layer(i) for i in range(L))
    experts, router = moe_layer_flops(cfg) if n_moe else (0.0, 0.0)
    return FlopsBreakdown(**attn, mlp=(L - n_moe) * ffn_flops(cfg, cfg.ffn_hidden), experts=n_moe * experts,
                          router=n_moe * router, **head, seq_len=seq_len, causal=causal)


def encoder_decoder_flops(model_cfg, cfg: ModelConfig, seq_len: int, head: dict, causal: bool) -> FlopsBreakdown:
    """Forward FLOPs per text token of a window of S = ``seq_len`` ids: the encoder runs on its M input
    ids (full M x M square), the decoder on its T targets (self-attention over T, cross-attention over M,
    the LM head), and the memory's K/V projection once per encoder token; each summed over its tokens and
    divided by S (``head``: the objective's head FLOPs per decoder token). Per target token: multiply by
    S / T (:func:`sequence_lengths`). Reported with ``causal`` False whatever ``causal`` says: the encoder's
    square is all useful, and the decoder's self-attention (T of the M + T tokens) is reported whole too."""
    M, T = sequence_lengths(model_cfg, seq_len)
    L, attention = cfg.n_layers, attention_class(cfg)
    enc = [attention.forward_flops(cfg, M, layer=i) for i in range(L)]
    dec = [attention.forward_flops(cfg, T, layer=i) for i in range(L)]
    attn = {k: (M * sum(f[k] for f in enc) + T * sum(f[k] for f in dec)) / seq_len for k in ATTENTION_KEYS}
    cross = CrossAttention.forward_flops(cfg, M)
    per_decoder_token = cross["q_proj"] + cross["out_proj"] + cross["scores"] + cross["values"]
    return FlopsBreakdown(
        **attn, mlp=L * (M + T) * ffn_flops(cfg, cfg.ffn_hidden) / seq_len, experts=0.0, router=0.0,
        lm_head=T * head["lm_head"] / seq_len,
        cross_attention=L * (T * per_decoder_token + M * cross["kv_proj"]) / seq_len,
        seq_len=seq_len, causal=False)


# a model type's ``stacks`` -> how its forward FLOPs compose: one stack, or an encoder and a cross-attending decoder
COMPOSE = {1: stack_flops, 2: encoder_decoder_flops}


def sequence_lengths(model_cfg, seq_len: int) -> tuple[int, int]:
    """An encoder-decoder's (encoder input M, decoder targets T) for a text window of ``seq_len`` ids: span
    corruption's (a recipe's ``train.objective`` settings where it is span_corruption, else T5's defaults)."""
    train = model_cfg.train if isinstance(model_cfg, DictConfig) and "train" in model_cfg else None
    o = train.objective if train is not None and isinstance(train.objective, DictConfig) else {}
    density = float(o.get("noise_density", SpanCorruptionConfig.noise_density))
    mean = float(o.get("mean_length", SpanCorruptionConfig.mean_length))
    n, k = span_counts(seq_len, density, mean)
    return seq_len - n + k, n + k


def training_flops(model_cfg, seq_len: int, objective: str | None = None) -> FlopsBreakdown:
    """Forward + backward matmul FLOPs per token (3x the forward), by component; in a one-stack model, each
    attention layer's variant states its own (``training_flops``: Gated DeltaNet's chunked form differs)."""
    out = forward_flops(model_cfg, seq_len, objective).scaled(1.0 + BACKWARD_TO_FORWARD)
    cfg = model_config(model_cfg)
    if model_class(cfg).stacks != 1:
        return out
    extra = dict.fromkeys(ATTENTION_KEYS, 0.0)
    for i in range(cfg.n_layers):
        attention = attention_class(cfg, i)
        own, fwd = attention.training_flops(cfg, seq_len, layer=i), attention.forward_flops(cfg, seq_len, layer=i)
        for k in ATTENTION_KEYS:
            extra[k] += own[k] - (1.0 + BACKWARD_TO_FORWARD) * fwd[k]
    return replace(out, **{k: getattr(out, k) + v for k, v in extra.items()})


def forward_flops_per_token(model_cfg, seq_len: int) -> float:
    """Forward matmul FLOPs per token at context ``seq_len`` (attention: full S x S square)."""
    return forward_flops(model_cfg, seq_len).total


def training_flops_per_token(model_cfg, seq_len: int, objective: str | None = None) -> float:
    """Training (forward + backward) matmul FLOPs per token; the numerator of MFU."""
    return training_flops(model_cfg, seq_len, objective).total
