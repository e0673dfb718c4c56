"""Parameter counts from the config alone: total, embedding, non-embedding, active per token.

Every count comes from the components' own ``num_params`` (``Decoder``, ``MoELayer``...); this
module only regroups them. Conventions:

- embedding = the token table (V*D) + the position tables (learned positions; T5's relative bias, one per
  stack of an encoder-decoder); an untied LM head is NOT
  embedding (it is a D x V matmul every token pays), so non-embedding = total - embedding
  includes it (OLMo-core's convention; Kaplan's N excludes the LM head only when it is tied).
- non_embedding_no_head = non_embedding without the LM head, tied or untied: the blocks (and final
  norm) only, so a tied and an untied model of one shape count the same (the scaling fits' N).
- non_embedding_with_head = non_embedding_no_head + the output projection's D x V matmul, counted
  whether tied or untied (``output_projection``).
- active = what one token's forward uses: every parameter except the routed experts it was not
  sent to, i.e. per MoE layer ``MoELayer.num_params - MoELayer.active_params``
  ((E-K) experts) fewer than total.
- experts = the routed experts' parameters (all E), the part expert parallelism shards.
- mtp = the multi-token-prediction modules (``model.mtp_depth``): trained, then dropped at inference and
  export, so they are in none of the counts above (DeepSeek-V3 reports its 671B without its 14B MTP
  module the same way); the model states of training (``archlab.costs.memory``) add them.
"""

from __future__ import annotations

from dataclasses import dataclass

from archlab.config.schema import ModelConfig, model_config
from archlab.model.build import model_class
from archlab.model.decoder import Decoder
from archlab.nn.moe.experts import expert_params
from archlab.nn.moe.layer import MoELayer
from archlab.nn.positions import position_params


@dataclass(frozen=True)
class ParamCounts:
    total: int
    embedding: int  # token table + learned position table
    lm_head: int  # untied output projection (0 when tied)
    routed_experts: int  # all routed experts of all MoE layers
    active: int  # used by one token
    mtp: int = 0  # multi-token-prediction modules: trained, not exported (not in ``total``)
    output_projection: int = 0  # the LM head's D x V matmul, tied or untied (V*D either way)

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding

    @property
    def non_embedding_no_head(self) -> int:
        """Neither the token and position tables nor the LM head, whether tied or untied."""
        return self.non_embedding - self.lm_head

    @property
    def non_embedding_with_head(self) -> int:
        """The blocks plus the LM head's D x V matmul, whether tied or untied."""
        return self.non_embedding_no_head + self.output_projection

    @property
    def active_no_head(self) -> int:
        """What one token uses, without the token and position tables and the LM head."""
        return self.active - self.embedding - self.lm_head

    @property
    def dense(self) -> int:
        """Everything but the routed experts: replicated on every expert-parallel rank."""
        return self.total - self.routed_experts

    def as_dict(self) -> dict[str, int]:
        out = {"total": self.total, "embedding": self.embedding, "non_embedding": self.non_embedding,
               "active": self.active, "lm_head": self.lm_head, "routed_experts": self.routed_experts,
               "output_projection": self.output_projection, "non_embedding_no_head": self.non_embedding_no_head,
               "non_embedding_with_head": self.non_embedding_with_head, "active_no_head": self.active_no_head}
        return {**out, "mtp": self.mtp} if self.mtp else out


def n_moe_layers(cfg: ModelConfig) -> int:
    return sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))


def param_counts(model_cfg) -> ParamCounts:
    """Parameter counts of the model a recipe (or ``ModelConfig``) describes."""
    cfg = model_config(model_cfg)
    total = model_class(cfg).num_params(cfg)
    embedding = cfg.vocab_size * cfg.d_model + model_class(cfg).stacks * position_params(cfg)
    lm_head = 0 if cfg.tie_embeddings else cfg.vocab_size * cfg.d_model
    routed = inactive = 0
    n_moe = n_moe_layers(cfg)
    if n_moe:
        moe = MoELayer
        routed = n_moe * cfg.moe.num_experts * expert_params(cfg.ffn.type, cfg.d_model, cfg.moe.expert_hidden)
        inactive = n_moe * (moe.num_params(cfg) - moe.active_params(cfg))
    return ParamCounts(total=total, embedding=embedding, lm_head=lm_head, routed_experts=routed,
                       active=total - inactive, mtp=Decoder.num_mtp_params(cfg),
                       output_projection=cfg.vocab_size * cfg.d_model)

