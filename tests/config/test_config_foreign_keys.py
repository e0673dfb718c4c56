"""Options belong to their variant (``archlab/config/options.py``): a recipe key that only other
variants of its kind read is refused before anything is built, naming the key, the selected
variant and the variants that read it; and a refused key really has no effect on the model or the
schedule it was refused for.
"""

from __future__ import annotations

import ast
import copy
import importlib
from pathlib import Path

import pytest
import torch

import archlab
from archlab import RecipeError
from archlab.config.options import CHOICES, CONDITIONS, leaf_keys
from archlab.config.schema import TrainConfig
from archlab.model import model_class
from archlab.options import _get

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "recipes/llama/tiny.yaml"
MIXTRAL = ROOT / "recipes/mixtral/tiny.yaml"
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "launch" not in p.parts)

# a small model, so that the no-effect check builds two of them per key
SMALL = ["model.vocab_size=300", "model.max_seq_len=32", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
         "train.seq_len=32"]
# what a recipe of the schema defaults needs besides the selector to select a variant validly
SETUP = {
    ("model", "type", "encoder"): ["train.objective=mlm"],
    ("model", "type", "encoder_decoder"): ["train.objective=span_corruption", "model.position.type=relative",
                                           "train.eval_context_multipliers=[1]"],
    ("model", "attention.type", "sliding_window"): ["model.attention.window=8"],
    ("model", "attention.type", "mla"): ["model.position.type=rope", "model.attention.kv_lora_rank=16",
                                         "model.attention.qk_rope_head_dim=4", "model.attention.qk_nope_head_dim=8",
                                         "model.attention.v_head_dim=8"],
    ("model", "position.rope_scaling.type", "*"): ["model.position.type=rope"],
    ("model", "moe.router.type", "*"): ["model.moe.num_experts=4", "model.moe.expert_hidden=16"],
    ("model", "moe.router.type", "expert_choice"): ["model.moe.num_experts=4", "model.moe.expert_hidden=16",
                                                    "model.moe.capacity_factor=2.0"],
    ("train", "objective.type", "mlm"): ["model.type=encoder"],
    ("train", "objective.type", "span_corruption"): ["model.type=encoder_decoder", "model.position.type=relative",
                                                "train.eval_context_multipliers=[1]"],
    ("train", "objective.type", "mtp"): ["model.mtp_depth=1"],
    ("train", "objective.type", "classify"): ["train.eval_context_multipliers=[1]"],
    ("train", "objective.type", "tag"): ["train.eval_context_multipliers=[1]"],
    ("train", "objective.type", "span_qa"): ["train.eval_context_multipliers=[1]"],
    ("train", "objective.type", "bound"): ["train.eval_context_multipliers=[1]"],
    ("data", "source", "text"): ["data.paths=[corpus.txt]"],
    ("data", "source", "hf"): ["data.hf_dataset=wikitext"],
    ("data", "source", "tokens"): ["data.train_shards=shards/train_*.bin"],
}
# non-default values of the keys whose default says nothing of their type (None) or is a name
VALUES = {
    "model.attention.window": 8,
    "model.attention.qk_norm_over": "projection",
    "model.attention.q_lora_rank": 8,
    "model.attention.gdn_k_heads": 2, "model.attention.gdn_v_heads": 4, "model.attention.gdn_k_head_dim": 8,
    "model.attention.gdn_v_head_dim": 8, "model.attention.gdn_kernels": "torch",
    "model.position.rope_scaling.type": "linear",
    "model.position.rope_scaling.original_max_seq_len": 16,
    "model.mup_base_width": 16,
    "model.block.type": "parallel",
    "model.ffn.approximate": "none",
    "train.init_from": "runs/pre-trained",
    "train.upcycle": {"method": "drop"},
    "data.paths": ["corpus.txt"],
    "data.hf_dataset": "wikitext",
    "data.hf_config": "wikitext-2-raw-v1",
    "data.hf_split": "validation",
    "data.hf_text_field": "content",
    "data.train_shards": "shards/train_*.bin",
    "data.val_shards": "shards/val_*.bin",
    "data.shard_format": "llmc",
    "data.max_bytes": 100000,
    "train.decay_shape": "sqrt",
    "train.betas": [0.8, 0.9],
    "train.muon.momentum": 0.9,
    "train.muon.adjust_lr_fn": "original",
}
# every Registry in archlab: the choice it backs (section, selector), or why it selects no keys
REGISTRIES = {
    "archlab.model.decoder.MODELS": ("model", "type"),
    "archlab.model.decoder.BLOCKS": ("model", "block.type"),
    "archlab.nn.positions.POSITIONS": ("model", "position.type"),
    "archlab.nn.positions.ROPE_SCALINGS": ("model", "position.rope_scaling.type"),
    "archlab.nn.moe.router.ROUTERS": ("model", "moe.router.type"),
    "archlab.data.sources.SOURCES": ("data", "source"),
    "archlab.optim.schedules.SCHEDULES": ("train", "schedule"),
    "archlab.optim.base.OPTIMIZERS": ("train", "optimizer"),
    "archlab.config.schema.OBJECTIVES": ("train", "objective.type"),
}
NO_KEYS = {
    # the type chooses the node's dataclass: another variant's key is unknown (tests/config/test_config_variants.py)
    "archlab.nn.ffn.FFNS": "model.ffn's dataclass is its type's",
    "archlab.nn.norms.NORMS": "model.norm's dataclass is its type's",
    "archlab.nn.attention.base.ATTENTIONS": "model.attention's dataclass is its type's (a layer pattern's)",
    # each term is switched on by its own coefficient: no key of model.moe.balance belongs to a term that is off
    "archlab.nn.moe.balance.BALANCE_TERMS": "test_each_balancing_term_owns_its_coefficient",
    # both tokenizers read the same keys (the vocabulary size is the model's)
    "archlab.data.tokenizer.TOKENIZERS": "no data key depends on data.tokenizer",
    # no recipe key selects an adapter: archlab.hf finds it from the architecture or config.json
    "archlab.hf.adapter.ADAPTERS": "not a recipe choice",
    # no recipe key selects a task: each understanding objective (train.objective tag, span_qa, bound) names its own
    "archlab.data.tasks.__init__.TASKS": "chosen by train.objective",
    # no recipe key selects a probe: an experiment's measurements (mqar, mad) name their tasks
    "archlab.data.probes.base.PROBES": "chosen by an experiment spec's measurements",
}


def non_default(path: str, default):
    if path in VALUES:
        return VALUES[path]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 1
    if isinstance(default, float):
        return default * 2 if default else 0.5
    raise AssertionError(f"{path} (default {default!r}): add a non-default value to VALUES")


def dotlist(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _full(section: str, *parts: str) -> str:
    return ".".join(p for p in (section, *parts) if p)


def selecting(section: str, choice, variant: str) -> list[str]:
    setup = SETUP.get((section, choice.selector, variant), SETUP.get((section, choice.selector, "*"), []))
    return [*SMALL, *setup, f"{_full(section, choice.selector)}={variant}"]


def foreign_cases():
    """(section, choice, selected variant, key in the node, the variants that read it)."""
    for section, choices in CHOICES.items():
        for c in choices:
            for variant in sorted(c.variants()):
                for key, users in c.governed():
                    if variant not in users:
                        yield pytest.param(section, c, variant, key, users,
                                           id=f"{_full(section, c.selector)}={variant}:{key}")


CASES = list(foreign_cases())


# ----------------------------------------------------------------------------- the walk


@pytest.mark.parametrize("section,choice,variant,key,users", CASES)
def test_a_key_of_another_variant_is_refused_naming_key_variant_and_users(section, choice, variant, key, users):
    base = selecting(section, choice, variant)
    archlab.load_recipe(None, base)  # valid as it stands
    path = _full(section, choice.node, key)
    value = non_default(path, _get(choice.schema(), key))
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(None, [*base, f"{path}={dotlist(value)}"])
    msg = str(err.value)
    assert msg.startswith(f"{path}="), msg  # the key=value: rule form
    assert f"only used by {choice.label} {', '.join(users)};" in msg, msg
    assert msg.endswith(f"this recipe's {choice.subject} is {variant}"), msg


def test_the_walk_covers_every_variant_of_every_kind():
    """Every variant of every choice is the selected one of some case, except a variant that reads
    every governed key (yarn, wsd)."""
    covered = {(s, c.selector, v) for s, c, v, _, _ in (case.values for case in CASES)}
    for section, choices in CHOICES.items():
        for c in choices:
            governed = dict(c.governed())
            for variant in c.variants():
                reads_all = all(variant in users for users in governed.values())
                assert reads_all or (section, c.selector, variant) in covered, (section, c.selector, variant)
    assert len(CASES) >= 50


def _registries_in_source() -> set[str]:
    """``module.NAME`` of every module-level ``NAME = Registry(...)`` in archlab."""
    found = set()
    for path in sorted((ROOT / "archlab").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.parse(path.read_text()).body:
            value = getattr(node, "value", None)
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                found.add(f"{module}.{target.id}")
    return found


def test_every_registry_backs_a_choice_or_says_why_it_selects_no_keys():
    assert _registries_in_source() == set(REGISTRIES) | set(NO_KEYS)
    choices = {(s, c.selector): c for s, cs in CHOICES.items() for c in cs}
    for dotted, (section, selector) in REGISTRIES.items():
        module, name = dotted.rsplit(".", 1)
        registry = getattr(importlib.import_module(module), name)
        assert sorted(choices[section, selector].variants()) == registry.names(), dotted


@pytest.mark.parametrize("section,choice", [(s, c) for s, cs in CHOICES.items() for c in cs if c.node],
                         ids=lambda x: getattr(x, "selector", x))
def test_every_option_of_a_component_node_is_read_by_some_variant(section, choice):
    """A new field of a component's config must be claimed in some variant's ``options`` (else it
    would be read by none, or by all without saying so)."""
    keys = {k for k in leaf_keys(choice.schema()) if k != "type"}
    governed = {k for k, _ in choice.governed()}
    assert keys - governed == set(), f"{section}.{choice.node}: no variant states these options"
    for variant, reads in choice.variants().items():  # and no variant claims a key the node lacks
        assert all(any(k == r or k.startswith(r + ".") for k in keys) for r in reads), (variant, reads)


def test_each_balancing_term_owns_its_coefficient():
    """model.moe.balance has one key per term and the key is the term's switch (0 = off), so no
    balancing key can be set for a term that is off."""
    from archlab.nn.moe.balance import BalanceConfig, term_classes

    assert sorted(c.key for c in term_classes()) == sorted(leaf_keys(BalanceConfig()))
    assert all(getattr(BalanceConfig(), c.key) == 0 for c in term_classes())


# ----------------------------------------------------------------------------- no effect, really


def _set(obj, path: str, value) -> None:
    head, _, leaf = path.rpartition(".")
    setattr(_get(obj, head), leaf, value)


MODEL_CASES = [c for c in CASES if c.values[0] == "model"]
CONDITION_CASES = [  # (overrides making the condition false, key under model, value)
    (["model.ffn.type=swiglu", "model.ffn.hidden=48"], "ffn.multiple_of", 8),
    ([*SETUP["model", "moe.router.type", "*"]], "moe.shared_hidden", 8),
    ([*SETUP["model", "moe.router.type", "*"]], "moe.min_capacity", 1),
    (["model.attention.qk_norm=false"], "attention.qk_norm_over", "projection"),
    (["model.position.type=none"], "attention.rotary_fraction", 0.5),
]


def _same_model(overrides: list[str], key: str, value) -> None:
    a = archlab.model_config(archlab.load_recipe(None, overrides))
    b = copy.deepcopy(a)
    _set(b, key, value)
    torch.manual_seed(0)
    model_a = model_class(a)(a).eval()
    torch.manual_seed(0)
    model_b = model_class(b)(b).eval()  # built without validation: the key's value reaches the model
    sd_a, sd_b = model_a.state_dict(), model_b.state_dict()
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a), key
    ids = torch.randint(0, a.vocab_size, (2, 24))
    args = (ids, ids[:, :9]) if a.type == "encoder_decoder" else (ids,)  # an encoder-decoder reads decoder ids too
    with torch.no_grad():
        assert torch.equal(model_a(*args).logits, model_b(*args).logits), key
    assert model_class(a).num_params(a) == model_class(b).num_params(b), key


@pytest.mark.parametrize("section,choice,variant,key,users", MODEL_CASES)
def test_a_refused_model_key_changes_nothing_in_the_model(section, choice, variant, key, users):
    path = _full(section, choice.node, key)
    value = non_default(path, _get(choice.schema(), key))
    _same_model(selecting(section, choice, variant), _full(choice.node, key), value)


def test_every_model_condition_has_a_case():
    assert sorted(k.key for k in CONDITIONS["model"]) == sorted(key for _, key, _ in CONDITION_CASES)


@pytest.mark.parametrize("overrides,key,value", CONDITION_CASES, ids=[k for _, k, _ in CONDITION_CASES])
def test_a_model_key_refused_by_its_condition_changes_nothing(overrides, key, value):
    base = [*SMALL, *overrides]
    with pytest.raises(RecipeError, match=rf"^model\.{key}='?{value}'?: only used when "):  # a string: its repr
        archlab.load_recipe(None, [*base, f"model.{key}={value}"])
    _same_model(base, key, value)


def _lrs(t) -> list[float]:
    from archlab.train.optim import lr_at

    return [lr_at(step, t) for step in range(t.max_steps)]


@pytest.mark.parametrize("schedule", ["cosine", "wsd", "constant"])
def test_schedules_read_exactly_their_keys(schedule):
    """Each schedule class's ``options`` against ``lr_at``: a key of another schedule leaves every
    step's lr as it is; each key the schedule reads changes some step's lr."""
    choice = next(c for c in CHOICES["train"] if c.selector == "schedule")
    base = TrainConfig(schedule=schedule, max_steps=60, warmup_steps=5)
    for key, users in choice.governed():
        t = copy.deepcopy(base)
        setattr(t, key, {"decay_steps": 10}.get(key, non_default(f"train.{key}", getattr(base, key))))
        assert (_lrs(t) != _lrs(base)) == (schedule in users), key


def _two_steps(t) -> list[torch.Tensor]:
    """The weights of a small model after two steps of ``t``'s optimizer on fixed gradients."""
    from archlab.train.optim import build_optimizer

    torch.manual_seed(0)
    model = archlab.build_model(archlab.load_recipe(None, SMALL))
    opt = build_optimizer(model, t)
    gen = torch.Generator().manual_seed(1)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_optimizers_read_exactly_their_keys(optimizer):
    """Each optimizer class's ``options`` against what it builds: a key of another optimizer leaves
    two steps' weights as they are; each key the optimizer reads changes them."""
    choice = next(c for c in CHOICES["train"] if c.selector == "optimizer")
    base = TrainConfig(optimizer=optimizer, lr=1e-2)
    ref = _two_steps(base)
    for key, users in choice.governed():
        t = copy.deepcopy(base)
        _set(t, key, non_default(f"train.{key}", _get(base, key)))
        changed = any(not torch.equal(a, b) for a, b in zip(ref, _two_steps(t)))
        assert changed == (optimizer in users), key


# ----------------------------------------------------------------------------- the issue and the sections


def test_the_issues_example():
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(LLAMA, ["model.attention.window=16"])
    assert str(err.value) == ("model.attention.window=16: not a key of attention.type mha (its keys: type, bias, "
                              "scale, dropout, qk_norm, qk_norm_over, output_gate, rotary_fraction); window is read "
                              "by attention.type sliding_window")
    archlab.load_recipe(LLAMA, ["model.attention.type=sliding_window", "model.attention.window=16"])


def test_a_base_recipes_option_must_be_reset_when_a_child_switches_variant():
    """mistral/tiny sets window 48: switching it to mha leaves a window that nothing reads."""
    with pytest.raises(RecipeError, match="window=48: not a key of attention.type mha .*; window is read by "
                                          "attention.type sliding_window"):
        archlab.load_recipe(ROOT / "recipes/mistral/tiny.yaml", ["model.attention.type=mha"])
    archlab.load_recipe(ROOT / "recipes/mistral/tiny.yaml", ["model.attention.type=mha", "model.attention.window=null"])


def test_a_key_at_its_default_is_harmless_where_it_is_not_read():
    archlab.load_recipe(LLAMA, ["model.attention.global_every=0", "model.norm.bias=true", "train.decay_steps=0",
                                "data.hf_split=train"])


@pytest.mark.parametrize("overrides,message", [
    (["train.decay_steps=20"],
     "train.decay_steps=20: only used by train.schedule wsd; this recipe's schedule is cosine"),
    (["train.decay_shape=sqrt"], "train.decay_shape='sqrt': only used by train.schedule wsd;"),
    (["train.decay_fraction=0.5"], "train.decay_fraction=0.5: only used by train.schedule wsd;"),
    (["train.schedule=constant", "train.min_lr_ratio=0.0"],
     "train.min_lr_ratio=0.0: only used by train.schedule cosine, wsd; this recipe's schedule is constant"),
    (["train.schedule=wsd", "train.decay_steps=20", "train.decay_fraction=0.5"],
     "train.decay_fraction=0.5: only used when train.decay_steps is 0 .*; this recipe has train.decay_steps=20"),
])
def test_training_keys_of_another_schedule_are_refused(overrides, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        archlab.load_recipe(LLAMA, overrides)


def test_training_keys_of_the_chosen_schedule_load():
    archlab.load_recipe(LLAMA, ["train.schedule=wsd", "train.decay_steps=20", "train.decay_shape=sqrt",
                                "train.min_lr_ratio=0.0"])
    archlab.load_recipe(LLAMA, ["train.schedule=wsd", "train.decay_fraction=0.5"])
    archlab.load_recipe(LLAMA, ["train.schedule=cosine", "train.min_lr_ratio=0.0"])


def test_moe_keys_on_a_dense_recipe():
    """A dense recipe has no moe node (model.moe: null); its MoE-only training key is refused, and
    model.moe.num_experts set on it makes it an MoE model (every other moe key takes its default)."""
    with pytest.raises(RecipeError, match=r"^train\.routing_every=5: only used when model\.moe is set .*"
                                          r"this recipe has model\.moe=None \(a dense model\)$"):
        archlab.load_recipe(LLAMA, ["train.routing_every=5"])
    assert archlab.load_recipe(MIXTRAL, ["train.routing_every=5"]).train.routing_every == 5
    assert archlab.load_recipe(LLAMA, ["model.moe.num_experts=4"]).model.moe.top_k == 2


@pytest.mark.parametrize("overrides,key", [
    (["model.moe.balance.aux_loss_coeff=0.01"], "model.moe.balance.aux_loss_coeff=0.01"),
    (["model.moe.router.type=sigmoid_topk"], "model.moe.router.type='sigmoid_topk'"),
    (["model.moe.top_k=1", "model.moe.router.jitter=0.1"], "model.moe.top_k=1"),
    (["model.moe={}"], "model.moe={}"),
])
def test_moe_is_switched_on_by_num_experts_only(overrides, key):
    """Issue 37: a router or balancing key alone on a dense recipe built an 8-expert MoE with no
    message. Now it is refused by name, like a key of any variant that is not selected; the MoE
    recipes (which all set num_experts) and num_experts itself switch MoE on."""
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(LLAMA, overrides)
    msg = str(err.value)
    assert msg.startswith(key + ": only used by an MoE model"), msg
    assert "model.moe.num_experts is not set" in msg and "\n" not in msg
    if len(overrides) > 1:
        assert "also set: model.moe.router.jitter" in msg
    cfg = archlab.load_recipe(LLAMA, ["model.moe.num_experts=4", *overrides[:1]] if overrides != ["model.moe={}"]
                              else ["model.moe.num_experts=4"])
    assert cfg.model.moe.num_experts == 4
    assert archlab.load_recipe(MIXTRAL, ["model.moe.balance.aux_loss_coeff=0.02"]).model.moe.balance.aux_loss_coeff \
        == 0.02
    assert archlab.load_recipe(MIXTRAL, ["model.moe=null"]).model.moe is None  # MoE switched off as before


def test_every_moe_recipe_switches_moe_on_by_num_experts():
    """The MoE recipes keep loading unchanged: each writes model.moe.num_experts itself (or in its base)."""
    moe = [p for p in RECIPES if archlab.load_recipe(p).model.moe is not None]
    assert {p.parent.name for p in moe} >= {"mixtral", "deepseek"}


@pytest.mark.parametrize("overrides,message", [
    (["model.moe.shared_hidden=64"], "model.moe.shared_hidden=64: only used when moe.n_shared_experts > 0; "
                                     "this recipe has moe.n_shared_experts=0"),
    (["model.moe.min_capacity=2"], "model.moe.min_capacity=2: only used when moe.capacity_factor is set"),
    (["model.ffn.hidden=null", "model.ffn.type=gelu", "model.ffn.multiple_of=64"],
     "model.ffn.multiple_of=64: not a key of ffn.type gelu (its keys: type, hidden, bias, dropout, approximate); "
     "multiple_of is read by ffn.type swiglu"),
])
def test_moe_and_ffn_keys_without_effect_are_refused(overrides, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        archlab.load_recipe(MIXTRAL, overrides)
    archlab.load_recipe(MIXTRAL, ["model.moe.n_shared_experts=1", "model.moe.shared_hidden=64"])
    archlab.load_recipe(MIXTRAL, ["model.moe.capacity_factor=1.25", "model.moe.min_capacity=2"])


@pytest.mark.parametrize("overrides,message", [
    (["data.hf_dataset=wikitext"], "data.hf_dataset='wikitext': only used by data.source hf; "
                                   "this recipe's data source is stdlib"),
    (["data.paths=[corpus.txt]"], r"data.paths=\['corpus.txt'\]: only used by data.source text;"),
    (["data.source=text", "data.paths=[corpus.txt]", "data.hf_split=test"],
     "data.hf_split='test': only used by data.source hf; this recipe's data source is text"),
])
def test_data_keys_of_another_source_are_refused(overrides, message):
    with pytest.raises(RecipeError, match=message):
        archlab.load_recipe(LLAMA, overrides)
    archlab.load_recipe(LLAMA, ["data.source=hf", "data.hf_dataset=wikitext", "data.hf_split=test"])


@pytest.mark.parametrize("path", RECIPES, ids=[str(p.relative_to(ROOT / "recipes")) for p in RECIPES])
def test_every_shipped_recipe_still_loads(path):
    archlab.load_recipe(path)
