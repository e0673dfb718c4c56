"""The model node's rules, checked before a model is built: the shared sizes, then each component's own rules,
asked of the component itself (``archlab.model.build`` runs them; ``archlab.config.validate`` as part of a
recipe). Each failure names the key, the value and the rule."""

from __future__ import annotations

from archlab.errors import fail
from archlab.errors import fraction as _fraction
from archlab.errors import one_of as _one_of
from archlab.errors import positive as _positive
from archlab.model.decoder import BLOCKS, MODELS, block_type
from archlab.model.options import check_model_options
from archlab.nn.attention import ATTENTIONS, attention_classes, layer_pattern, validate_pattern
from archlab.nn.ffn import FFNS, ffn_class
from archlab.nn.moe.balance import validate_balance
from archlab.nn.moe.router import ROUTERS, router_class
from archlab.nn.mup import PARAMETRIZATIONS
from archlab.nn.norms import NORMS, norm_class
from archlab.nn.positions import POSITIONS, ROPE_SCALINGS, position_class


def validate_model(m, prefix: str = "model") -> None:
    """Model rules. ``m`` is the ``model`` node of a recipe (DictConfig or ModelConfig): the
    shared sizes here, then each component's own rules, asked of the component itself."""
    _positive(m, prefix, "vocab_size", "max_seq_len", "d_model", "n_layers", "n_heads")
    # every type name first, so that a component's rules may ask another component
    _one_of(f"{prefix}.type", m.type, MODELS.names())
    _one_of(f"{prefix}.attention.type", m.attention.type, ATTENTIONS.names())
    validate_pattern(m, prefix)  # model.layers.pattern: registered names, a depth it divides
    if layer_pattern(m) and m.type != "decoder":
        fail(f"{prefix}.layers.pattern", list(m.layers.pattern),
             f"a layer pattern needs model.type decoder, not {m.type}")
    _one_of(f"{prefix}.norm.type", m.norm.type, NORMS.names())
    _one_of(f"{prefix}.position.type", m.position.type, POSITIONS.names())
    _one_of(f"{prefix}.position.rope_scaling.type", m.position.rope_scaling.type, ROPE_SCALINGS.names())
    _one_of(f"{prefix}.ffn.type", m.ffn.type, FFNS.names())
    _one_of(f"{prefix}.block.type", m.block.type, BLOCKS.names())
    _one_of(f"{prefix}.parametrization", m.parametrization, PARAMETRIZATIONS)
    if getattr(m, "mtp_depth", 0) < 0:
        fail(f"{prefix}.mtp_depth", m.mtp_depth, "must be >= 0 (0 = no multi-token-prediction modules)")
    if m.moe is not None:
        _one_of(f"{prefix}.moe.router.type", m.moe.router.type, ROUTERS.names())
    check_model_options(m, prefix)  # a key that no chosen variant reads
    for attention in attention_classes(m):
        attention.validate(m, prefix)
    norm_class(m).validate(m, prefix)
    position_class(m).validate(m, prefix)
    ffn_class(m).validate(m.ffn, f"{prefix}.ffn")
    block_type(m).validate(m, prefix)  # e.g. the parallel block is pre-LN only
    MODELS.get(m.type).validate(m, prefix)  # e.g. an encoder's components must run without the causal mask
    _fraction(f"{prefix}.dropout", m.dropout)
    _positive(m, prefix, "init_std")
    validate_parametrization(m, prefix)

    if m.moe is not None:
        validate_moe(m.moe, m.n_layers, f"{prefix}.moe", ROUTERS)


class _ModelView:
    """The ``model``-node view the MoE components' rules read (``m.moe``, ``m.n_layers``)."""

    def __init__(self, moe, n_layers: int):
        self.moe, self.n_layers = moe, n_layers


def validate_parametrization(m, prefix: str = "model") -> None:
    """standard or mup; a muP base width, when given, is a positive d_model."""
    _one_of(f"{prefix}.parametrization", m.parametrization, PARAMETRIZATIONS)
    if m.mup_base_width is not None and m.mup_base_width <= 0:
        fail(f"{prefix}.mup_base_width", m.mup_base_width,
              "must be a positive number (the base model's d_model; null = d_model, width multiplier 1)")


def validate_moe(e, n_layers: int, prefix: str, routers) -> None:
    _positive(e, prefix, "num_experts", "top_k", "expert_hidden", "every", "min_capacity", "ep_size")
    if e.top_k > e.num_experts:
        fail(f"{prefix}.top_k", e.top_k, f"must be <= num_experts ({e.num_experts})")
    if e.n_shared_experts < 0:
        fail(f"{prefix}.n_shared_experts", e.n_shared_experts, "must be >= 0")
    if e.shared_hidden is not None and e.shared_hidden <= 0:
        fail(f"{prefix}.shared_hidden", e.shared_hidden, "must be a positive number (or null)")
    if not 0 <= e.first_k_dense < n_layers:
        fail(f"{prefix}.first_k_dense", e.first_k_dense,
              f"must lie in [0, n_layers={n_layers}) so that at least one layer is MoE")
    _one_of(f"{prefix}.router.type", e.router.type, routers.names())
    model_prefix = prefix.rsplit(".", 1)[0]
    m = _ModelView(e, n_layers)
    router_class(m).validate(m, model_prefix)  # groups, route scale, jitter: the router's own rules
    validate_balance(m, model_prefix)  # each balancing term's rules
    if e.capacity_factor is not None and e.capacity_factor <= 0:
        fail(f"{prefix}.capacity_factor", e.capacity_factor, "must be positive (or null for dropless routing)")
    if e.num_experts % e.ep_size:
        fail(f"{prefix}.ep_size", e.ep_size, f"must divide num_experts ({e.num_experts})")
