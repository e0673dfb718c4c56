"""Invalid recipes fail at load time with a message naming the key, the value and the rule."""

from pathlib import Path

import pytest

import archlab
from archlab import RecipeError

ROOT = Path(__file__).resolve().parents[2]
DENSE = ROOT / "recipes/dense/tiny.yaml"
LLAMA = ROOT / "recipes/llama/tiny.yaml"

# (recipe, overrides, substrings the message must contain)
INVALID = [
    (DENSE, ["model.nonsense=1"], ["unknown key", "model.nonsense"]),
    (DENSE, ["nonsense=1"], ["unknown key", "nonsense"]),
    (DENSE, ["model.norm.type=batchnorm"], ["model.norm.type='batchnorm'", "must be one of", "layernorm, rmsnorm"]),
    (DENSE, ["model.position.type=t5"], ["model.position.type='t5'", "alibi", "learned", "relative", "rope"]),
    (DENSE, ["model.ffn.type=geglu"], ["model.ffn.type='geglu'", "gelu, relu, swiglu"]),
    (DENSE, ["model.norm.placement=middle"], ["model.norm.placement='middle'", "pre, post"]),
    (DENSE, ["model.d_model=100", "model.n_heads=3"],
     ["model.n_heads=3", "d_model (100) must be divisible by n_heads"]),
    (LLAMA, ["model.n_kv_heads=3"], ["model.n_kv_heads=3", "n_heads (4) must be divisible by n_kv_heads"]),
    (LLAMA, ["model.n_kv_heads=0"], ["model.n_kv_heads=0", "positive"]),
    (LLAMA, ["model.d_model=72", "model.n_heads=8"], ["model.n_heads=8", "head dim", "= 9 must be even"]),
    (DENSE, ["model.d_model=-96"], ["model.d_model=-96", "must be a positive number"]),
    (DENSE, ["model.n_layers=0"], ["model.n_layers=0", "must be a positive number"]),
    (DENSE, ["model.vocab_size=-5"], ["model.vocab_size=-5", "positive"]),
    (DENSE, ["model.d_model=abc"], ["model.d_model", "abc"]),
    (DENSE, ["model.ffn.hidden=-1"], ["model.ffn.hidden=-1", "positive"]),
    (DENSE, ["model.attention.dropout=1.5"], ["model.attention.dropout=1.5", "[0, 1)"]),
    (DENSE, ["model.attention.scale=0"], ["model.attention.scale=0.0", "positive"]),
    (DENSE, ["model.position.rope_scaling.type=linear"],
     ["model.position.rope_scaling.type='linear'", "only used by position.type rope", "position is learned"]),
    (LLAMA, ["model.position.rope_scaling.type=ntk", "model.position.rope_scaling.factor=0.5"],
     ["rope_scaling.factor=0.5", ">= 1"]),
    (LLAMA, ["model.position.rope_scaling.type=dynamic"], ["rope_scaling.type='dynamic'", "linear, none, ntk, yarn"]),
    (DENSE, ["train.seq_len=4096"], ["train.seq_len=4096", "model.max_seq_len=1024"]),
    (DENSE, ["train.betas=[0.9]"], ["train.betas=[0.9]", "two numbers"]),
    (DENSE, ["train.schedule=linear"], ["train.schedule='linear'", "constant, cosine, wsd"]),
    (DENSE, ["train.optimizer=sgd"], ["train.optimizer='sgd'", "adamw, muon"]),
    (DENSE, ["train.optimizer=muon", "train.muon.adjust_lr_fn=keller"], ["train.muon.adjust_lr_fn='keller'",
                                                                        "match_rms_adamw, original"]),
    (DENSE, ["train.optimizer=muon", "train.muon.momentum=1.0"], ["train.muon.momentum=1.0", "[0, 1)"]),
    (DENSE, ["train.warmup_steps=1000"], ["train.warmup_steps=1000", "max_steps=300"]),
    (DENSE, ["train.schedule=wsd", "train.decay_shape=cubic"], ["train.decay_shape='cubic'", "linear, sqrt"]),
    (DENSE, ["train.schedule=wsd", "train.decay_steps=280"],
     ["train.decay_steps=280", "max_steps - warmup_steps = 270"]),
    (DENSE, ["train.schedule=wsd", "train.decay_steps=-1"], ["train.decay_steps=-1", "must lie in [0,"]),
    (DENSE, ["train.ckpt_steps=[0,100]"], ["train.ckpt_steps=[0, 100]", "[1, max_steps=300]"]),
    (DENSE, ["train.ckpt_steps=[301]"], ["train.ckpt_steps=[301]", "[1, max_steps=300]"]),
    (DENSE, ["train.branch_from=runs/a/checkpoints/step_00000010", "train.resume=runs/a"],
     ["train.resume='runs/a'", "contradicts train.branch_from", "resume=auto"]),
    (DENSE, ["data.tokenizer=byte", "model.vocab_size=100"], ["model.vocab_size=100", "byte tokenizer", ">= 257"]),
    (DENSE, ["data.source=text"], ["data.paths=[]", "at least one file"]),
    (DENSE, ["model.n_layers"], ["model.n_layers", "key=value"]),
    (LLAMA, ["model.moe.num_experts=8", "model.moe.top_k=9"], ["model.moe.top_k=9", "num_experts (8)"]),
    (LLAMA, ["model.moe.num_experts=8", "model.moe.first_k_dense=4"],
     ["model.moe.first_k_dense=4", "at least one layer is MoE"]),
    (LLAMA, ["model.parametrization=mu_p"], ["model.parametrization='mu_p'", "must be one of: standard, mup"]),
    (LLAMA, ["model.parametrization=mup", "model.mup_base_width=0"], ["model.mup_base_width=0", "positive"]),
    (LLAMA, ["model.parametrization=mup", "model.mup_base_width=-128"], ["model.mup_base_width=-128", "positive"]),
    (LLAMA, ["model.mup_base_width=wide"], ["model.mup_base_width", "wide"]),
]


@pytest.mark.parametrize("recipe,overrides,expected", INVALID, ids=[" ".join(o) for _, o, _ in INVALID])
def test_invalid_recipe_is_rejected_with_a_precise_message(recipe, overrides, expected):
    with pytest.raises(RecipeError) as err:
        archlab.load_recipe(recipe, overrides)
    msg = str(err.value)
    for part in expected:
        assert part in msg, f"{part!r} not in {msg!r}"
    assert "Traceback" not in msg and "\n" not in msg


def test_the_table_is_big_enough():
    assert len(INVALID) >= 15


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_unknown_key_in_a_yaml_file(tmp_path):
    p = write(tmp_path, "r.yaml", "model:\n  d_modle: 64\n")
    with pytest.raises(RecipeError, match="unknown key 'model.d_modle'"):
        archlab.load_recipe(p)


def test_wrong_type_in_a_yaml_file(tmp_path):
    p = write(tmp_path, "r.yaml", "model:\n  n_layers: four\n")
    with pytest.raises(RecipeError, match="model.n_layers.*four"):
        archlab.load_recipe(p)


def test_missing_file_bad_yaml_and_non_mapping(tmp_path):
    with pytest.raises(RecipeError, match="recipe file not found"):
        archlab.load_recipe(tmp_path / "nope.yaml")
    with pytest.raises(RecipeError, match="not valid YAML"):
        archlab.load_recipe(write(tmp_path, "bad.yaml", "model: {d_model: [\n"))
    with pytest.raises(RecipeError, match="a recipe is a YAML mapping"):
        archlab.load_recipe(write(tmp_path, "list.yaml", "- 1\n- 2\n"))


def test_base_chain_that_loops(tmp_path):
    write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(RecipeError, match="loops back"):
        archlab.load_recipe(tmp_path / "a.yaml")


def test_validation_happens_before_building():
    """build_model refuses an invalid config object that never went through load_recipe."""
    from archlab.config.schema import ModelConfig

    with pytest.raises(RecipeError, match="n_kv_heads"):
        archlab.build_model(ModelConfig(n_heads=4, n_kv_heads=3))
