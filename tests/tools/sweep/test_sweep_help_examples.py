"""Every example in ``python -m tools.sweep --help`` passes the sweep's own design check (``--check``): the help
shows no command that the tool would refuse."""

from __future__ import annotations

import shlex

import pytest

from tools.sweep import cli

# options of an example that train, write or report rather than plan; the check replaces them
DROP_WITH_VALUE = {"--jobs", "--threads", "--archive", "--restore", "--out"}
DROP = {"--status", "--dry-run"}


def help_examples(doc: str, module: str) -> list[list[str]]:
    """The argument lists of the ``python -m <module>`` commands in a help text (continuations joined,
    comments dropped)."""
    text = doc.replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith(f"python -m {module} "):
            out.append(shlex.split(line)[3:])
    return out


def as_check(argv: list[str], out) -> list[str]:
    """An example as its design check: the options that train or write replaced by ``--check`` (and ``--out``)."""
    keep, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in DROP_WITH_VALUE:
            skip = True
        elif a not in DROP:
            keep.append(a)
    return keep + ["--check", "--out", str(out)]


EXAMPLES = help_examples(cli.__doc__, "tools.sweep")
CHECKS = list(dict.fromkeys(tuple(as_check(a, "OUT")) for a in EXAMPLES))  # the same check once


def test_the_help_has_examples_and_a_quick_one():
    assert len(EXAMPLES) >= 5 and ["--quick", "--jobs", "2", "--threads", "1"] in EXAMPLES


@pytest.mark.parametrize("argv", CHECKS, ids=[" ".join(a[:-3]) for a in CHECKS])
def test_every_help_example_passes_the_design_check(argv, tmp_path, capsys):
    argv = [str(tmp_path / "sweep") if a == "OUT" else a for a in argv]
    assert cli.main(argv) == 0, capsys.readouterr()
