"""A component node's dataclass is chosen by its ``type:`` key (``archlab.config.variants``): a key the chosen
variant lacks is refused by name, naming the chosen type, the keys it accepts and the types that read it; a
component is built from its own config and the facts of its site, without a ``ModelConfig``."""

from __future__ import annotations

import pickle
from dataclasses import fields

import pytest
import torch

import archlab
from archlab import RecipeError
from archlab.config.schema import LayersConfig, ModelConfig
from archlab.config.variants import variant_nodes
from archlab.nn import component
from archlab.nn.attention import AttentionConfig
from archlab.nn.component import field_default
from archlab.nn.ffn import FFNConfig, GeluConfig, SwiGLU, SwiGLUConfig

SMALL = ["model.vocab_size=300", "model.max_seq_len=32", "model.d_model=32", "model.n_layers=2", "model.n_heads=4",
         "train.seq_len=32"]
# what a recipe of the schema defaults needs besides the type to select a variant validly
SETUP = {
    "sliding_window": ["model.attention.window=8"],
    "mla": ["model.position.type=rope", "model.attention.kv_lora_rank=16", "model.attention.qk_rope_head_dim=4",
            "model.attention.qk_nope_head_dim=8", "model.attention.v_head_dim=8"],
    "gated_deltanet": ["model.position.type=none"],
}
# non-default values where the default says nothing of the type (None, a name)
VALUES = {"approximate": "none", "window": 8, "qk_norm_over": "projection", "q_lora_rank": 8, "gdn_k_heads": 2,
          "gdn_v_heads": 4, "gdn_k_head_dim": 8, "gdn_v_head_dim": 8, "gdn_kernels": "torch"}


def _non_default(default):
    if isinstance(default, bool):
        return str(not default).lower()
    if isinstance(default, (int, float)):
        return default + 1
    raise AssertionError(f"default {default!r}: add a non-default value to VALUES")


def foreign_cases():
    """(node path, chosen variant, key of another variant, the variants that read it)."""
    for path, base in variant_nodes(ModelConfig):
        configs = {n: base.variants.get(n).Config for n in base.variants.names()}
        for chosen, config in configs.items():
            own = {f.name for f in fields(config)}
            for key in sorted({f.name for c in configs.values() for f in fields(c)} - own):
                users = [n for n, c in configs.items() if key in {f.name for f in fields(c)}]
                yield pytest.param(path, chosen, key, users, id=f"{path}.type={chosen}:{key}")


CASES = list(foreign_cases())


@pytest.mark.parametrize("path,chosen,key,users", CASES)
def test_a_key_the_chosen_variant_lacks_is_refused_naming_type_keys_and_readers(path, chosen, key, users):
    base = [*SMALL, *SETUP.get(chosen, []), f"model.{path}.type={chosen}"]
    archlab.load_recipe(None, base)  # valid as it stands
    config = archlab.model_config(archlab.load_recipe(None, base))
    reader = type(getattr(config, path)).variants.get(users[0]).Config
    value = VALUES.get(key) or _non_default(field_default(reader, key))
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(None, [*base, f"model.{path}.{key}={value}"])
    msg = str(err.value)
    accepted = ", ".join(f.name for f in fields(type(getattr(config, path))))
    assert msg.startswith(f"model.{path}.{key}="), msg
    assert f"not a key of {path}.type {chosen} (its keys: {accepted}); {key} is read by {path}.type " \
           f"{', '.join(users)}" in msg, msg


def test_the_walk_has_cases():
    assert len(CASES) >= 4


def test_a_key_of_another_variant_at_its_default_is_dropped():
    """A resolved recipe saved before each variant had its own config writes every variant's defaults."""
    cfg = archlab.load_recipe(None, [*SMALL, "model.ffn.type=swiglu", "model.ffn.approximate=tanh"])
    assert "approximate" not in cfg.model.ffn and cfg.model.ffn.multiple_of == 32


def test_the_type_chooses_the_dataclass_in_python_too():
    cfg = ModelConfig(ffn=FFNConfig(type="swiglu", bias=False))
    assert type(cfg.ffn) is SwiGLUConfig and cfg.ffn.bias is False
    assert type(ModelConfig().ffn) is GeluConfig
    with pytest.raises(RecipeError, match=r"model\.ffn\.approximate='none': not a key of ffn\.type swiglu"):
        ModelConfig(ffn=GeluConfig(type="swiglu", approximate="none"))


def test_an_ffn_is_built_from_its_own_config_without_a_model_config():
    config = SwiGLUConfig(bias=False)
    ffn = SwiGLU(config, d_model=16, hidden=24)
    assert ffn(torch.randn(3, 16)).shape == (3, 16)
    assert SwiGLU.num_params(config, d_model=16, hidden=24) == sum(p.numel() for p in ffn.parameters())
    assert SwiGLU.default_hidden(config, d_model=48) == 128  # 8/3 * 48 rounded up to multiple_of 32


def test_a_layer_patterns_config_unpickles_where_its_class_was_not_built_yet():
    """A spawned worker unpickles the hybrid's attention config before anything there built its dataclass."""
    cfg = ModelConfig(n_layers=4, layers=LayersConfig(pattern=["gated_deltanet", "mha"]),
                      attention=AttentionConfig(bias=False))
    name = type(cfg.attention).__name__
    data = pickle.dumps(cfg)
    delattr(component, name)  # as in a fresh process
    component._union.cache_clear()
    back = pickle.loads(data)
    assert type(back.attention).__name__ == name and vars(back.attention) == vars(cfg.attention)
    assert back.attention.gdn_conv_kernel == 4 and back.attention.qk_norm is False
