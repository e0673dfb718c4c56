"""The recipe-key reference, generated from the schema: every key, its type, default and comment.

    python -m archlab.config.reference > docs/recipe-keys.md

The schema's dataclasses (``archlab.config.schema.Recipe`` and the component configs it composes)
are the one source: each field's comment, written on its line or on the comment lines just above it,
becomes its description. ``tests/test_docs_reference.py`` fails when docs/recipe-keys.md differs.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import sys
import typing
from typing import Any, Optional

from archlab.config.schema import Recipe

HEADER = """# Recipe keys

Every key a recipe may set, generated from the schema (`archlab/config/schema.py` and the component configs it
composes) by `python -m archlab.config.reference > docs/recipe-keys.md`; a test fails when this page is stale.
A key is set in YAML or as a dotlist override (`python -m archlab.train RECIPE model.d_model=256`). Where a
node's `type` chooses its dataclass (`model.attention`, `model.ffn`), each variant's own keys are listed in a
section of their own and a key the chosen variant lacks is unknown (`archlab/config/variants.py`); elsewhere a key
that only another variant reads is refused unless left at its default (`archlab/config/options.py`).
"""

FIELD_LINE = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+(=|$)")


def _comments(cls: type) -> dict[str, str]:
    """{field: comment} for the fields ``cls`` itself annotates: the comment on the field's line, or the
    run of comment lines just above it (a preceding comment comes first when both are there)."""
    try:
        lines = inspect.getsource(cls).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = FIELD_LINE.match(line)
        if match and match.group(1) in cls.__dict__.get("__annotations__", {}):
            trailing = line.split("#", 1)[1].strip() if "#" in line else ""
            lead = " ".join(above)
            if lead and trailing and not lead.endswith((".", ":", ";")):
                lead += ":"
            out[match.group(1)] = " ".join(part for part in [lead, trailing] if part)
        above = []
    return out


def _field_comments(cls: type) -> dict[str, str]:
    """Comments for every field of ``cls``, inherited fields from the class that declares them."""
    out: dict[str, str] = {}
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base):
            out.update(_comments(base))
    return out


def _nested(tp: Any) -> Optional[type]:
    """The dataclass a field holds (``X`` or ``Optional[X]``), else None."""
    if dataclasses.is_dataclass(tp):
        return tp
    for arg in typing.get_args(tp):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _type_name(tp: Any) -> str:
    text = tp.__name__ if isinstance(tp, type) else str(tp)
    return re.sub(r"typing\.|archlab\.[\w.]+\.", "", text).replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return ""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def sections(cls: type = Recipe, prefix: str = "") -> list[tuple[str, type, list[tuple[str, str, str, str]]]]:
    """[(node, dataclass, [(key, type, default, comment)])] in schema order, nested nodes after their parent."""
    hints = typing.get_type_hints(cls)
    comments = _field_comments(cls)
    rows, children = [], []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        inner = _nested(hints[f.name])
        if inner is not None:
            default = "null" if f.default is None else "(a node)"
            anchor = key.replace(".", "")
            what = " ".join(t for t in [comments.get(f.name, ""), f"Its keys: [`{key}.*`](#{anchor})."] if t)
            rows.append((key, inner.__name__, default, what))
            children.extend(sections(inner, f"{key}."))
            children.extend(_variant_sections(inner, key))
        else:
            rows.append((key, _type_name(hints[f.name]), _default(f), comments.get(f.name, "")))
    return [(prefix.rstrip(".") or "(top level)", cls, rows), *children]


def _variant_sections(base: type, key: str) -> list[tuple[str, type, list[tuple[str, str, str, str]]]]:
    """A node whose ``type`` chooses its dataclass: one section per variant config, its keys beyond the base's."""
    if "variants" not in vars(base):
        return []
    by_config: dict[type, list[str]] = {}
    for name in base.variants.names():
        by_config.setdefault(base.variants.get(name).Config, []).append(name)
    out = []
    shared = {f.name for f in dataclasses.fields(base)}
    for config, names in by_config.items():
        hints, comments = typing.get_type_hints(config), _field_comments(config)
        rows = [(f"{key}.{f.name}", _type_name(hints[f.name]), _default(f), comments.get(f.name, ""))
                for f in dataclasses.fields(config) if f.name not in shared]
        if rows:
            out.append((f"{key} (type: {', '.join(names)})", config, rows))
    return out


def render() -> str:
    parts = [HEADER]
    for node, cls, rows in sections():
        parts.append(f"\n## `{node}`\n" if node != "(top level)" else "\n## Top level\n")
        doc = (cls.__doc__ or "").strip()
        if doc and not doc.startswith(f"{cls.__name__}("):
            parts.append(f"\n{doc.splitlines()[0].replace('``', '`')}\n")
        parts.append(f"\nDeclared by `{cls.__module__}.{cls.__qualname__}`.\n\n")
        parts.append("| key | type | default | what |\n| --- | --- | --- | --- |\n")
        for key, tp, default, comment in rows:
            value = f"`{_cell(default)}`" if default and default != "(a node)" else default
            parts.append(f"| `{key}` | {_cell(tp)} | {value} | {_cell(comment)} |\n")
    return "".join(parts)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
