"""train.objective is a node whose dataclass its type chooses (each objective's Config): a bare name is short
for {type: NAME}; an objective's options exist only under it; the flat train keys before it are read as their
new place, with a warning, so that saved run folders and experiment records keep loading."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import archlab
from archlab import RecipeError
from archlab.config.load import moved_keys
from archlab.config.schema import ObjectiveConfig, TrainConfig
from archlab.objectives.classify import ClassifyConfig
from archlab.objectives.mtp import MTPConfig
from archlab.train.run_folder import resume_changes

DENSE = "recipes/dense/tiny.yaml"
MTP = ["model.mtp_depth=1", "train.objective=mtp"]


def test_the_type_chooses_the_objectives_dataclass():
    cfg = archlab.load_recipe(DENSE, [*MTP, "train.objective.weight=0.1"])
    assert OmegaConf.get_type(cfg.train.objective) is MTPConfig and cfg.train.objective.weight == 0.1
    assert OmegaConf.get_type(archlab.load_recipe(DENSE).train.objective) is ObjectiveConfig
    assert isinstance(TrainConfig(objective=ObjectiveConfig(type="classify")).objective, ClassifyConfig)


def test_a_bare_name_and_the_node_load_the_same():
    short = archlab.load_recipe(DENSE, MTP)
    node = archlab.load_recipe(DENSE, ["model.mtp_depth=1", "train.objective.type=mtp"])
    assert short.train.objective == node.train.objective == {"type": "mtp", "weight": 0.3}


def test_another_objectives_option_is_refused_naming_its_readers():
    with pytest.raises(RecipeError, match=r"^train.objective.pooling='mean': not a key of objective.type mtp "
                                          r"\(its keys: type, weight\); pooling is read by objective.type bound, "
                                          r"classify$"):
        archlab.load_recipe(DENSE, [*MTP, "train.objective.pooling=mean"])


def test_each_moved_key_names_a_field_of_its_readers():
    moved = moved_keys()
    assert moved["mtp_weight"] == ("weight", ["mtp"])
    assert moved["classify_pooling"] == ("pooling", ["bound", "classify"])
    assert len(moved) == 7
    for old, (new, users) in moved.items():
        for u in users:
            assert new in archlab.objectives.OBJECTIVES.get(u).Config.__dataclass_fields__, (old, u)


def test_a_flat_key_of_before_is_read_as_its_place_with_a_warning():
    with pytest.warns(UserWarning, match=r"train.mtp_weight=0.1: read as train.objective.weight=0.1"):
        cfg = archlab.load_recipe(DENSE, [*MTP, "train.mtp_weight=0.1"])
    assert cfg.train.objective.weight == 0.1
    with pytest.warns(UserWarning), pytest.raises(RecipeError, match=r"^train.objective.weight=0.1: not a key of "
                                                                     r"objective.type causal_lm"):
        archlab.load_recipe(DENSE, ["train.mtp_weight=0.1"])


def _old_saved_recipe(tmp_path: Path, objective: str, **flat) -> Path:
    """A resolved recipe as run folders saved it before the objective was a node: every flat key, a bare name."""
    cfg = OmegaConf.to_container(archlab.load_recipe(DENSE, MTP if objective == "mtp" else []))
    t = cfg["train"]
    t["objective"] = objective
    t.update({"mtp_weight": 0.3, "mlm_probability": 0.15, "span_noise_density": 0.15, "span_mean_length": 3.0,
              "classify_pooling": None, "classify_train_examples": 8192, "classify_eval_examples": 1024, **flat})
    path = tmp_path / "recipe.yaml"
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return path


def test_a_saved_recipe_of_before_loads(tmp_path, recwarn):
    cfg = archlab.load_recipe(_old_saved_recipe(tmp_path, "mtp"))
    assert cfg.train.objective == {"type": "mtp", "weight": 0.3}
    assert not recwarn.list  # every flat key at its default: nothing to say
    with pytest.warns(UserWarning, match=r"train.mtp_weight=0.1 is read as train.objective.weight"):
        assert archlab.load_recipe(_old_saved_recipe(tmp_path, "mtp", mtp_weight=0.1)).train.objective.weight == 0.1


def test_resuming_a_checkpoint_of_before_sees_no_change(tmp_path):
    cfg = archlab.load_recipe(DENSE, MTP)
    _old_saved_recipe(tmp_path, "mtp")
    (tmp_path / "state.json").write_text("{}")
    assert resume_changes(cfg, tmp_path) == []
    changed = archlab.load_recipe(DENSE, [*MTP, "train.objective.weight=0.1"])
    assert resume_changes(changed, tmp_path) == [{"key": "train.objective.weight", "checkpoint": 0.3, "run": 0.1}]
