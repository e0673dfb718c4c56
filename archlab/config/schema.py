"""The recipe schema: typed OmegaConf structured configs.

A recipe is YAML merged onto these dataclasses, so an unknown key or a wrong type fails at load
time. Each field says what it is and why it exists. A component's config lives beside the
component (``archlab.nn``: ``NormConfig`` in norms.py, ``PositionConfig`` in positions.py,
``AttentionConfig`` in attention/, ``FFNConfig`` in ffn.py, ``MoEConfig`` in moe/layer.py with
``RouterConfig`` in moe/router.py and ``BalanceConfig`` in moe/balance.py; an optimizer's options in
``archlab.optim``, ``MuonConfig`` in muon.py); this module composes them. ``type:``
fields name an entry of a component registry; each component states its own rules, which
``archlab.config.validate`` asks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, List, Optional

from omegaconf import DictConfig, OmegaConf

from archlab.config.variants import select, variant_nodes
from archlab.nn.attention import AttentionConfig, MHAConfig, attention_classes
from archlab.nn.component import variant_config
from archlab.nn.ffn import FFNConfig, GeluConfig, ffn_class
from archlab.nn.moe.balance import BalanceConfig
from archlab.nn.moe.layer import MoEConfig
from archlab.nn.moe.router import RouterConfig
from archlab.nn.norms import LayerNormConfig, NormConfig
from archlab.nn.positions import PositionConfig, RopeScalingConfig
from archlab.optim.muon import MuonConfig
from archlab.registry import Registry

__all__ = ["AttentionConfig", "BalanceConfig", "BlockConfig", "DataConfig", "FFNConfig", "LayersConfig",
           "ModelConfig", "MoEConfig", "MuonConfig", "NormConfig", "OBJECTIVES", "ObjectiveConfig", "PositionConfig",
           "Recipe", "RopeScalingConfig", "RouterConfig", "TrainConfig", "UpcycleConfig"]


@dataclass
class BlockConfig:
    # how a layer composes attention and FFN (archlab/model/decoder.py, parallel_block.py): sequential x + attn(norm
    # x), then + ffn(norm .); parallel x + attn(norm x) + ffn(norm x), both branches read the layer's input
    type: str = "sequential"  # sequential (GPT-2, LLaMA) | parallel (GPT-J, PaLM, GPT-NeoX)
    shared_norm: bool = True  # parallel: one norm feeds both branches (GPT-J, PaLM); false: one each (GPT-NeoX)


@dataclass
class LayersConfig:
    # the token mixer of each layer: attention.type names repeated over the depth (layer i uses pattern[i % len],
    # n_layers a multiple of len), each reading its own keys of model.attention; a hybrid: Qwen3-Next's
    # [gated_deltanet, gated_deltanet, gated_deltanet, mha]. [] = every layer attention.type (decoder only)
    pattern: List[str] = field(default_factory=list)


@dataclass
class ModelConfig:
    # decoder (causal attention: GPT, LLaMA...) | encoder (bidirectional attention: BERT, trained by
    # train.objective=mlm) | encoder_decoder (T5: an encoder stack and a decoder stack with cross-attention, n_layers
    # each, trained by train.objective=span_corruption); archlab/model/{decoder,encoder,encoder_decoder}.py
    type: str = "decoder"
    vocab_size: int = 4096
    max_seq_len: int = 256  # positions the model is built for (learned table size, RoPE cache)
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: Optional[int] = None  # None = n_heads (MHA); 1 = MQA; in between = GQA
    norm: NormConfig = field(default_factory=LayerNormConfig)  # norm.type chooses its dataclass (archlab/nn/norms.py)
    position: PositionConfig = field(default_factory=PositionConfig)
    attention: AttentionConfig = field(default_factory=MHAConfig)  # attention.type (a pattern) chooses its dataclass.
    ffn: FFNConfig = field(default_factory=GeluConfig)  # ffn.type chooses its dataclass (archlab/nn/ffn.py).
    block: BlockConfig = field(default_factory=BlockConfig)  # how a layer composes attention and FFN (decoder)
    layers: LayersConfig = field(default_factory=LayersConfig)  # which attention.type each layer has (a hybrid)
    # set (with moe.num_experts, the switch: any other moe key alone is refused) to replace the FFN of (some)
    # layers by routed experts
    moe: Optional[MoEConfig] = None
    tie_embeddings: bool = True  # share the token embedding with the LM head (GPT-2 yes, LLaMA no)
    # multiply the token embedding by sqrt(d_model) (the 2017 Transformer, sec. 3.4; Gemma): with init_std 0.02
    # the tokens would otherwise be ~3% of a sinusoidal position's amplitude
    scale_embeddings: bool = False
    dropout: float = 0.0  # embedding and residual dropout
    init_std: float = 0.02
    scaled_residual_init: bool = True  # GPT-2: residual projections get std/sqrt(2*n_layers)
    # standard | mup (muP, Tensor Programs V: per-layer init, lr and output scaling by width; archlab/nn/mup.py)
    parametrization: str = "standard"
    # muP: d_model of the base model the lr was tuned on; width multiplier m = d_model / mup_base_width.
    # null = d_model (m = 1: the base itself); mup only (refused under standard parametrisation)
    mup_base_width: Optional[int] = None
    # multi-token prediction (DeepSeek-V3): this many sequential MTP modules, trained by train.objective=mtp
    # and dropped at inference and export (archlab/nn/mtp.py). 0 = none
    mtp_depth: int = 0
    # encoder (BERT): a norm (norm.type) on the summed token and position embeddings, before the blocks
    embed_norm: bool = False
    # encoder (BERT's MLM head): dense D -> D, the FFN's activation and a norm between the last block and the
    # LM head (archlab/nn/heads.py)
    head_transform: bool = False
    head_bias: bool = False  # encoder (BERT's MLM head): a bias on the LM head's logits

    def __post_init__(self):
        """Each component node as the dataclass its ``type`` chooses (``FFNConfig(type="swiglu")`` becomes a
        ``SwiGLUConfig``); a key that dataclass lacks is refused unless at its default."""
        for path, base in variant_nodes(ModelConfig):
            owner, _, leaf = path.rpartition(".")
            node = self
            for part in filter(None, owner.split(".")):
                node = getattr(node, part, None)
            if node is not None and getattr(node, leaf, None) is not None:
                names = base.chosen(self) if hasattr(base, "chosen") else None  # attention: a layer pattern's
                setattr(node, leaf, variant_config(getattr(node, leaf), names, prefix=f"model.{path}"))

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def rotary_dim(self) -> int:
        """Channels per head that RoPE rotates (the attention variant says: head dim, MLA's rope dim; a layer
        pattern: the widest of its variants')."""
        return max(a.rotary_dim(self) for a in attention_classes(self))

    @property
    def ffn_hidden(self) -> int:
        """Hidden width of a dense FFN: explicit, else the FFN type's default (GPT's 4d, LLaMA's 8/3 d)."""
        if self.ffn.hidden is not None:
            return self.ffn.hidden
        return ffn_class(self).default_hidden(self.ffn, d_model=self.d_model)

    def is_moe_layer(self, layer: int) -> bool:
        m = self.moe
        return m is not None and layer >= m.first_k_dense and (layer - m.first_k_dense) % m.every == 0


@dataclass
class DataConfig:
    # stdlib (embedded default: Python's own source) | shakespeare (plays; optional extra) | text | hf
    # | tokens (pre-tokenised shards, archlab/data/tokens.py)
    source: str = "stdlib"
    paths: List[str] = field(default_factory=list)  # text: files, folders or globs
    hf_dataset: Optional[str] = None  # hf: dataset name (needs the optional `datasets` package)
    hf_config: Optional[str] = None
    hf_split: str = "train"
    hf_text_field: str = "text"
    # tokens: a glob of training shards (sorted by name, concatenated), one file, or a folder holding
    # train.bin (+ val.bin: nanoGPT's prepare.py output, an archlab data cache folder)
    train_shards: Optional[str] = None
    val_shards: Optional[str] = None  # tokens: a glob of validation shards; null = the val.bin of a train_shards folder
    # tokens: auto (llm.c magic -> llmc; train.bin/val.bin beside an archlab meta.json -> archlab; else nanogpt)
    # | llmc (llm.c / modded-nanogpt: 256 int32 header, uint16 ids; llm.c's LLaMA-3 variant: uint32)
    # | nanogpt (raw uint16 ids, no header) | archlab (an archlab data cache folder)
    shard_format: str = "auto"
    # bpe (byte-level, trained here) | byte | path of a Hugging Face tokenizers file (tokenizer.json, e.g. GPT-2's);
    # tokens: bpe = the tokenizer.json beside the shards, if any (none needed to train)
    tokenizer: str = "bpe"
    # end-of-text id: tokens, or a tokenizer file; null = a sidecar's (meta.json) or the tokenizer's <|endoftext|>
    eot_id: Optional[int] = None
    val_fraction: float = 0.05  # share of files held out for validation (split by file); not tokens
    max_bytes: Optional[int] = None  # cap on corpus bytes read (quick runs); not tokens
    cache_dir: str = ".cache/archlab"  # tokenizer and token-id caches; tokens: per-shard id counts
    # stdlib: also the standard library's test suites (about 2.6x the text: ~31 MB instead of ~12 MB; the few
    # files of the encoding tests that are not UTF-8 are left out)
    stdlib_tests: bool = False
    seed: int = 0  # file-split seed; not tokens


@dataclass
class UpcycleConfig:
    # how a dense run's FFN becomes this MoE's experts (archlab/train/upcycle.py): copy (every expert a copy of
    # the layer's dense FFN; Komatsuzaki et al. 2022) | drop (copy, then a share drop_ratio of each expert's hidden
    # units re-initialised; Drop-Upcycling, Nakamura et al. 2025)
    method: str = "copy"
    drop_ratio: float = 0.5  # method drop: share r of each expert's hidden units re-initialised (paper: 0.5)


OBJECTIVES: Registry = Registry("objective")  # train.objective.type: filled by archlab.objectives' modules


@dataclass
class ObjectiveConfig:
    # the objective's name (an entry of archlab/objectives/); each objective's Config subclasses this node with
    # the options only it reads
    type: str = "causal_lm"
    variants: ClassVar[Registry] = OBJECTIVES  # objective.type chooses the dataclass: the objective's ``Config``


@dataclass
class TrainConfig:
    seq_len: int = 256
    micro_batch_size: int = 8  # per process
    grad_accum: int = 1
    max_steps: int = 300
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # final lr = lr * min_lr_ratio
    # cosine | wsd (warmup-stable-decay) | constant (a WSD stable trunk: never decays); archlab/optim/schedules.py
    schedule: str = "cosine"
    warmup_steps: int = 30
    # set at load, never by hand: the recipe's warmup_steps when it exceeded max_steps (a short run of a longer
    # recipe, e.g. train.max_steps=20 on a 30-step warmup), which is then capped to 10% of max_steps (at least 1
    # step; archlab/config/load.py: fit_warmup). null = not capped
    warmup_capped_from: Optional[int] = None
    decay_fraction: float = 0.2  # wsd: share of steps in the final decay
    decay_steps: int = 0  # wsd: length of the final decay in steps, overriding decay_fraction (0 = use the fraction)
    decay_shape: str = "linear"  # wsd decay: linear | sqrt (1 - sqrt(progress), best in Hägele et al. 2024)
    # adamw | muon (torch.optim.Muon on the blocks' matrices, AdamW on the rest: muon.*); archlab/optim/
    optimizer: str = "adamw"
    weight_decay: float = 0.1  # decoupled; never on norms, biases, embeddings
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])  # AdamW (under muon: its AdamW groups)
    eps: float = 1e-8  # AdamW (under muon: its AdamW groups)
    muon: MuonConfig = field(default_factory=MuonConfig)  # optimizer muon: momentum, nesterov, ns_steps, adjust_lr_fn
    # what the run trains on: objective.type chooses the node's dataclass, the objective's own Config
    # (archlab/objectives/: mtp's MTPConfig adds weight, mlm's probability...); a bare name is short for
    # {type: NAME}. causal_lm (next-token prediction) | mtp (DeepSeek-V3's multi-token prediction:
    # model.mtp_depth modules) | mlm (BERT's masked-token prediction: model.type encoder) | span_corruption
    # (T5's: model.type encoder_decoder) | classify (fine-tuning with a classification head on a labelled
    # task) | tag | span_qa | bound (understanding tasks, Python's ast as ground truth:
    # docs/understanding-tasks.md). The flat keys before it (train.mtp_weight...) are read as their place here,
    # with a warning (archlab/config/load.py: nest_objective, respell)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    # a pre-trained run folder (its newest complete checkpoint) or checkpoint folder whose weights the model loads
    # by name (objective classify and the understanding tasks: the trunk, whose tokenizer the task uses; null = a
    # fresh init, the no-pre-training control). causal_lm: the run's weights start this one (fresh optimizer, step
    # 0): loaded by name, or with train.upcycle a dense run's weights upcycled into this MoE. A train key, not an
    # objective option: it says where the weights come from, and the trainer and the experiment stages read it
    init_from: Optional[str] = None
    # objective causal_lm with init_from a dense run and an MoE model: sparse upcycling (archlab/train/upcycle.py)
    upcycle: Optional[UpcycleConfig] = None
    grad_clip: float = 1.0  # max global grad norm; 0 = off
    precision: str = "auto"  # auto (bf16 where supported, else fp32) | fp32 | bf16
    compile: bool = False  # torch.compile the model
    # recompute activations in backward to save memory (archlab/model/checkpointing.py): none | full (a block
    # keeps only its input; backward runs its forward again) | selective (a block also keeps its matmul and
    # attention outputs; backward recomputes only norms, activations, RoPE, softmax...). Same gradients
    activation_checkpointing: str = "none"
    seed: int = 0
    log_every: int = 10
    eval_every: int = 100
    eval_batches: int = 10
    eval_context_multipliers: List[int] = field(default_factory=lambda: [1, 2, 4])
    ckpt_every: int = 100
    ckpt_steps: List[int] = field(default_factory=list)  # extra checkpoints at these steps, never pruned (WSD branches)
    keep_last: int = 2  # checkpoints kept (besides those at ckpt_steps)
    resume: str = "none"  # none | auto | path of a checkpoint folder
    # a resume whose train settings (steps, schedule, lr, warmup, decay, optimizer, global batch...) differ from
    # its checkpoint's is refused, naming each difference; true continues with the new ones and records them
    # (resume_changes.jsonl, summary.json). Where the run writes and how often it logs, evaluates and
    # checkpoints may change freely (archlab/train/run_folder.py: RESUME_FREE)
    resume_allow_changes: bool = False
    # a checkpoint folder of another run: start this NEW run from its weights, optimizer, step, tokens and RNG
    # (a cooldown branch of a WSD trunk continues its data stream); resume=auto continues the branch itself
    branch_from: Optional[str] = None
    out_dir: str = "runs"
    run_name: Optional[str] = None  # default: recipe name + timestamp
    on_nonfinite: str = "stop"  # stop (keep last good checkpoint) | skip (drop the batch)
    # seconds a collective (a barrier, an all-reduce) waits for the other processes before the run fails:
    # torch.distributed's process-group timeout (accelerate's InitProcessGroupKwargs). It must cover the
    # longest wait, e.g. rank 0 preparing the data while the others wait. null = torch's default (NCCL 10 min,
    # gloo 30 min). One process: unused
    dist_timeout_s: Optional[float] = None
    peak_flops: Optional[float] = None  # for MFU; None = a per-device default stated in the log
    # experiment trackers, through accelerate (archlab/trackers.py): tensorboard | wandb | mlflow. Each gets
    # every metrics row and the resolved recipe as hyperparameters; run name = the run folder's. metrics.jsonl stays
    # the record. A tracker whose package is missing stops the run at start, naming the pip install line
    trackers: List[str] = field(default_factory=list)
    tracker_project: str = "archlab"  # trackers: the wandb project / MLflow experiment / TensorBoard subfolder
    # older spelling, folded into trackers at load: true = trackers gets tensorboard, false = it must not have it;
    # then null. (Before train.trackers it was true by default and wrote only where tensorboard was installed.)
    tensorboard: Optional[bool] = None
    routing_every: int = 0  # MoE: write a routing record every n steps (0 = log_every)
    # MoE: every n steps, the router's choices, gate weights and logits for 64 sampled tokens of every MoE layer,
    # to router_trace/ (archlab/train/router_trace.py; read with analysis.routing.read_trace). 0 = off
    router_trace_every: int = 0

    def __post_init__(self):
        """``objective`` as the dataclass its ``type`` chooses (``ObjectiveConfig(type="mtp")`` becomes an
        ``MTPConfig``, once archlab.objectives is imported); a key that dataclass lacks is refused unless at its
        default."""
        self.objective = variant_config(self.objective, prefix="train.objective")


@dataclass
class Recipe:
    name: str = "unnamed"
    family: str = "custom"  # dense | llama | gptj | vanilla | mixtral | expert_choice | deepseek | bert | custom
    description: str = ""
    compare_with: Optional[str] = None  # MoE: the dense recipe with equal active parameters
    base: Optional[str] = None  # a recipe file this one extends (relative path); resolved at load
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    extra: Any = None  # free-form notes for tools; never read by the library


def model_config(cfg) -> ModelConfig:
    """The typed ``ModelConfig`` object (with its derived properties) of a recipe or model node."""
    if isinstance(cfg, ModelConfig):
        return cfg
    node = cfg.model if "model" in cfg and "d_model" not in cfg else cfg
    if isinstance(node, DictConfig):
        schema = OmegaConf.structured(ModelConfig)
        written = OmegaConf.create(OmegaConf.to_container(node))
        select(schema, written, ModelConfig)
        return OmegaConf.to_object(OmegaConf.merge(schema, written))
    raise TypeError(f"expected a recipe DictConfig or ModelConfig, got {type(cfg).__name__}")
