"""The component protocol: the component table of docs/components.md, the schema's comments and the registries
name the same variants; every variant states the facts the rest of archlab asks of it; nothing
in ``archlab.nn`` imports the config package at run time.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

from archlab.config.schema import (
    AttentionConfig,
    BlockConfig,
    FFNConfig,
    ModelConfig,
    NormConfig,
    PositionConfig,
    RopeScalingConfig,
    RouterConfig,
)
from archlab.model.decoder import BLOCKS
from archlab.nn.attention import ATTENTIONS
from archlab.nn.ffn import FFNS
from archlab.nn.moe.router import ROUTERS
from archlab.nn.norms import NORMS
from archlab.nn.positions import POSITIONS, ROPE_SCALINGS

ROOT = Path(__file__).resolve().parents[2]
KINDS = {  # recipe key -> (registry, config dataclass holding its `type` field)
    "model.norm.type": (NORMS, NormConfig),
    "model.position.type": (POSITIONS, PositionConfig),
    "model.position.rope_scaling.type": (ROPE_SCALINGS, RopeScalingConfig),
    "model.attention.type": (ATTENTIONS, AttentionConfig),
    "model.ffn.type": (FFNS, FFNConfig),
    "model.moe.router.type": (ROUTERS, RouterConfig),
    "model.block.type": (BLOCKS, BlockConfig),
}


def _table_names(key: str, config) -> set[str]:
    """Backticked names in the second cell of the component-table row for ``key`` (option keys excluded)."""
    lines = [line.replace("\\|", "/") for line in (ROOT / "docs" / "components.md").read_text().splitlines()]
    rows = [line for line in lines if line.startswith("|") and f"`{key}`" in line.split("|")[1]]
    assert len(rows) == 1, f"docs/components.md needs one component-table row for {key}"
    cell = rows[0].split("|")[2]
    variants = [config.variants.get(n).Config for n in config.variants.names()] if hasattr(config, "variants") else []
    options = {f.name for c in (config, ModelConfig, *variants) for f in dataclasses.fields(c)}
    return {n for n in re.findall(r"`([a-z_0-9]+)`", cell) if n not in options}


def _schema_comment_names(config) -> set[str]:
    """Names in the comment of the ``type`` field: ``# a (note) | b | c (note)``."""
    for cls in config.__mro__:
        if "type" not in getattr(cls, "__annotations__", {}):
            continue
        lines = inspect.getsource(cls).splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s+type: str = ", line):
                comment = line.split("#", 1)[1] if "#" in line else lines[i - 1].split("#", 1)[1]
                return {part.split()[0] for part in comment.split("|")}
    raise AssertionError(f"{config.__name__} has no type field")


def test_component_table_lists_the_balancing_terms():
    from archlab.nn.moe.balance import BALANCE_TERMS, BalanceConfig

    assert _table_names("model.moe.balance.*", BalanceConfig) == set(BALANCE_TERMS.names())


@pytest.mark.parametrize("key", list(KINDS))
def test_component_table_schema_comments_and_registry_list_the_same_names(key):
    registry, config = KINDS[key]
    names = set(registry.names())
    assert _table_names(key, config) == names
    assert _schema_comment_names(config) == names


def _recipe_types() -> dict[str, set[str]]:
    import archlab

    used: dict[str, set[str]] = {key: set() for key in KINDS}
    for path in sorted((ROOT / "recipes").glob("*/*.yaml")):
        if path.parent.name == "launch":
            continue
        m = archlab.model_config(archlab.load_recipe(path))
        used["model.norm.type"].add(m.norm.type)
        used["model.position.type"].add(m.position.type)
        used["model.position.rope_scaling.type"].add(m.position.rope_scaling.type)
        used["model.attention.type"].add(m.attention.type)
        used["model.ffn.type"].add(m.ffn.type)
        used["model.block.type"].add(m.block.type)
        if m.moe is not None:
            used["model.moe.router.type"].add(m.moe.router.type)
    return used


@pytest.mark.parametrize("key", ["model.norm.type", "model.attention.type", "model.ffn.type", "model.moe.router.type",
                                 "model.block.type"])
def test_every_variant_has_a_recipe(key):
    """The cost-model tests check every recipe's FLOPs and saved bytes against measurement, so a
    recipe per variant means every variant's own facts are checked."""
    registry, _ = KINDS[key]
    assert set(registry.names()) <= _recipe_types()[key]


def test_nn_does_not_import_the_config_package_at_run_time():
    """Configs live beside their components and ``archlab.config`` composes them: an import of
    ``archlab.config`` in ``archlab/nn`` may only sit under ``if TYPE_CHECKING:``."""
    offenders = []
    for path in sorted((ROOT / "archlab" / "nn").rglob("*.py")):
        tree = ast.parse(path.read_text())
        guarded = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", None) == "TYPE_CHECKING" for n in ast.walk(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("archlab.config") \
                    and id(node) not in guarded:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders
