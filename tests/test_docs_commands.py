"""Every command in a ```bash block of README.md and of the guides in docs/ runs, or is checked as it would run.

A command is one line of a block (a trailing backslash continues it; a comment ends it), split at `&&` and `;`.
Quick commands run whole. A command that would train, serve or fit for long is checked by the rule of
``LONG`` below: `--print-config` for the trainer (the recipe and overrides resolved and validated, nothing
trained), `--help` for the other programs, the installed version for installs. In every case the program
must exist (an executable on PATH, or a module that ``python -m`` finds), every repository path it names must
exist (a glob must match), and a command naming a placeholder such as `runs/<run>` may only be checked by
`--help`. A command no rule covers fails: add its rule here.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ("python", "python3")

# how a long command is checked, by the words it starts with (after `python -m`, the module's name)
LONG = {
    "archlab.train": "print-config",  # trains: the resolved, validated recipe instead (trains nothing)
    "accelerate launch": "launch",  # `accelerate launch --help`, its --config_file exists, the trainer's --print-config
    "tools.experiment": "help",  # trains arms x seeds (even `plan` tokenises the corpus first)
    "tools.sweep": "help",  # trains a grid
    "tools.launch": "help",  # trains one run (locally or as a SLURM job) (its --check tokenises the corpus first)
    "tools.mup_sweep": "help",  # trains a grid
    "tools.bench": "help",  # times training steps
    "tools.gpu_check": "help",  # needs a GPU
    "tools.explore": "help",  # serves a page until stopped
    "tools.export_hf": "help",  # reads a run folder
    "tools.import_hf": "help",  # reads a Hugging Face model folder
    "tools.sample": "help",  # reads a run folder
    "tools.task_scores": "help",  # reads run folders and rebuilds their tasks' items
    "analysis.routing": "help",  # reads a run folder
    "analysis.scaling": "help",  # bootstrap fits and simulations: minutes
    "analysis.lr_coverage": "help",  # simulated grids, a bootstrap each: minutes (its tests run a few)
    "analysis.schedules": "help",  # reads run folders
    "analysis.probe_training": "help",  # trains a model on a probe task
    "pytest": "version",  # the test suite itself
    "ruff check": "version",  # the whole tree's lint
    "venv": "help",  # makes a virtual environment
    "pip install": "installed",  # each requirement is installed: a pinned version, or archlab with a declared extra
    "source": "activate",  # a virtual environment made earlier in the same command
}
# run whole: seconds each
QUICK = ("archlab.train --help", "analysis.costs", "archlab.config.reference", "bash -n")


@dataclass
class Command:
    doc: str
    line: int
    argv: list[str]
    before: list[list[str]] = field(default_factory=list)  # the commands before it in its && chain

    def __str__(self) -> str:
        return shlex.join(self.argv)


def commands(path: Path) -> list[Command]:
    """The commands of the ```bash blocks of ``path``."""
    out: list[Command] = []
    lines = path.read_text().splitlines()
    in_block, pending, start = False, "", 0
    for number, line in enumerate(lines, 1):
        if line.strip().startswith("```"):
            in_block = line.strip() == "```bash" if not in_block else False
            continue
        if not in_block:
            continue
        if not pending:
            start = number
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        chain: list[list[str]] = []
        for part in _split(shlex.split(pending, comments=True)):
            out.append(Command(str(path.relative_to(ROOT)), start, part, [*chain]))
            chain.append(part)
        pending = ""
    return out


def _split(tokens: list[str]) -> list[list[str]]:
    parts, current = [], []
    for token in tokens:
        if token in ("&&", ";"):
            parts.append(current)
            current = []
        else:
            current.append(token)
    return [p for p in [*parts, current] if p]


def _words(argv: list[str]) -> str:
    """What the rules match: `python -m X ...` -> `X ...`, else the argv."""
    if argv[0] in PYTHON and len(argv) > 2 and argv[1] == "-m":
        return " ".join(argv[2:])
    return " ".join(argv)


def _match(words: str, keys) -> str | None:
    return next((k for k in keys if words == k or words.startswith(k + " ")), None)


def _paths(argv: list[str]) -> list[str]:
    """The repository paths a command names (an override's value included)."""
    found = []
    for token in argv:
        value = token.split("=", 1)[1] if re.match(r"^[\w.]+=", token) else token
        if re.match(r"^(recipes|experiments|docs|tests|archlab|tools|analysis|\.ci)/", value) or value == "tests":
            found.append(value)
    return found


def _which(program: str) -> str | None:
    """``program`` on PATH, or beside this Python (a virtual environment's scripts, activated or not)."""
    return shutil.which(program, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def check(cmd: Command) -> list[str]:
    """What was wrong with ``cmd``: [] when it runs (or passes its rule's check)."""
    argv, words = cmd.argv, _words(cmd.argv)
    module = argv[2] if argv[0] in PYTHON and len(argv) > 2 and argv[1] == "-m" else None
    if module is not None:
        if importlib.util.find_spec(module) is None:
            return [f"no module {module}"]
    elif argv[0] != "source" and _which(argv[0]) is None:
        return [f"no program {argv[0]}"]
    problems = []
    for path in _paths(argv):
        if "<" in path:
            continue
        if not (glob.glob(str(ROOT / path)) if any(c in path for c in "*?[") else (ROOT / path).exists()):
            problems.append(f"no such path: {path}")
    quick = _match(words, QUICK)
    rule = None if quick else LONG.get(_match(words, LONG) or "")
    if quick is None and rule is None:
        return problems + [f"no rule for this command: add it to LONG or QUICK in {Path(__file__).name}"]
    if any("<" in token for token in argv) and rule != "help":
        return problems + ["a placeholder (runs/<run>) needs the `help` rule"]
    if problems:
        return problems
    return _run(argv, rule or "whole", cmd.before)


def _run(argv: list[str], rule: str, before: list[list[str]]) -> list[str]:
    argv = [sys.executable if argv[0] in PYTHON else (_which(argv[0]) or argv[0]), *argv[1:]]
    if rule == "whole":  # as a shell runs it: a repository glob expands
        return _subprocess([x for a in argv for x in (_expand(a) if a in _paths(argv) else [a])])
    if rule == "help":
        return _subprocess([*argv[:3], "--help"] if argv[0] == sys.executable else [argv[0], "--help"])
    if rule == "version":
        return _subprocess([*argv[:3], "--version"] if argv[0] == sys.executable else [argv[0], "--version"])
    if rule == "print-config":
        return _print_config(argv[3:])
    if rule == "launch":
        i = argv.index("-m")
        config = argv[argv.index("--config_file") + 1] if "--config_file" in argv else None
        problems = _subprocess([argv[0], "launch", "--help"])
        if config is not None and not (ROOT / config).is_file():
            problems.append(f"no launch config {config}")
        if argv[i + 1] != "archlab.train":
            return problems + [f"launches {argv[i + 1]}, not archlab.train"]
        return problems + _print_config(argv[i + 2:])
    if rule == "installed":
        return _installed(argv[2:])
    if rule == "activate":
        venv = argv[1].removesuffix("/bin/activate")
        made = any(b[:3] in (["python3", "-m", "venv"], ["python", "-m", "venv"]) and b[3:4] == [venv] for b in before)
        return [] if made or (ROOT / argv[1]).is_file() else [f"{argv[1]}: no virtual environment made before it"]
    raise AssertionError(rule)


def _expand(path: str) -> list[str]:
    return sorted(str(Path(p).relative_to(ROOT)) for p in glob.glob(str(ROOT / path))) or [path]


_SEEN: dict[tuple[str, ...], list[str]] = {}  # the same check (say `--help`) runs once per session


def _subprocess(argv: list[str]) -> list[str]:
    key = tuple(argv)
    if key not in _SEEN:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        _SEEN[key] = [] if done.returncode == 0 else [
            f"{shlex.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}"]
    return _SEEN[key]


def _print_config(args: list[str]) -> list[str]:
    """``python -m archlab.train ARGS --print-config``, in this process (the module's own ``main``)."""
    from archlab.train.__main__ import main

    if args == ["--help"]:
        args = []
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([*[a for a in args if a != "--print-config"], "--print-config"])
        except SystemExit as e:
            status = e.code
    return [] if status == 0 else [f"--print-config exited {status}: {err.getvalue()[-2000:]}"]


def _installed(requirements: list[str]) -> list[str]:
    problems = []
    try:
        extras = set(importlib.metadata.metadata("archlab").get_all("Provides-Extra") or [])
    except importlib.metadata.PackageNotFoundError:
        return ["archlab is not installed"]
    for req in (r for r in requirements if not r.startswith("-")):
        if m := re.fullmatch(r"\.(?:\[([\w,-]+)\])?", req):
            for extra in (m.group(1) or "").split(","):
                if extra and extra not in extras:
                    problems.append(f"archlab declares no extra {extra!r}")
        elif m := re.fullmatch(r"([\w.-]+)==([\w.+-]+)", req):
            have = importlib.metadata.version(m.group(1))
            if have.split("+")[0] != m.group(2):
                problems.append(f"{m.group(1)} {have} is installed, the docs pin {m.group(2)}")
        else:
            problems.append(f"no check for the requirement {req!r}")
    return problems


DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ALL = [c for doc in DOCS for c in commands(doc)]


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ALL, ids=lambda c: f"{c.doc}:{c.line}:{' '.join(c.argv[:4])}")
def test_command(cmd):
    assert check(cmd) == [], f"{cmd.doc}:{cmd.line}: {cmd}"


def test_the_readme_and_the_guides_have_commands():
    docs = {c.doc for c in ALL}
    assert "README.md" in docs and len(docs) >= 8 and len(ALL) >= 30
    assert ["python", "-m", "pytest", "tests", "-q"] in [c.argv for c in ALL if c.doc == "README.md"]


def test_extraction_joins_lines_drops_comments_and_splits_chains(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "g.md").write_text("text\n```bash\npython -m a.b x \\\n    y  # a comment\nfoo && bar ; baz\n```\n"
                                   "```sh\nnot me\n```\n")
    cmds = commands(tmp_path / "g.md")
    assert [c.argv for c in cmds] == [["python", "-m", "a.b", "x", "y"], ["foo"], ["bar"], ["baz"]]
    assert cmds[0].line == 3 and cmds[3].before == [["foo"], ["bar"]]


def _problems(line: str, before=()) -> list[str]:
    return check(Command("g.md", 1, shlex.split(line), [shlex.split(b) for b in before]))


def test_a_missing_program_module_or_recipe_fails():
    assert _problems("python -m tools.nowhere --help") == ["no module tools.nowhere"]
    assert _problems("no-such-program-here --flag") == ["no program no-such-program-here"]
    assert _problems("python -m archlab.train recipes/llama/nowhere.yaml") == [
        "no such path: recipes/llama/nowhere.yaml"]
    assert _problems("python -m analysis.costs 'recipes/*/nowhere.yaml'") == ["no such path: recipes/*/nowhere.yaml"]


def test_a_command_without_a_rule_fails():
    assert _problems("python -m archlab.data --help")[0].startswith("no rule for this command")


def test_a_placeholder_is_checked_by_help_only():
    assert _problems("python -m archlab.train runs/<run>/recipe.yaml") == [
        "a placeholder (runs/<run>) needs the `help` rule"]


def test_the_rules_map_long_commands_to_their_checks(monkeypatch):
    ran = []
    monkeypatch.setattr(sys.modules[__name__], "_subprocess", lambda argv: ran.append(argv) or [])
    monkeypatch.setattr(sys.modules[__name__], "_print_config", lambda args: ran.append(["print-config", *args]) or [])
    _problems("python -m tools.explore runs/<run> --port 1")
    _problems("python -m archlab.train recipes/llama/tiny.yaml train.max_steps=2")
    _problems("accelerate launch --config_file recipes/launch/zero2.yaml -m archlab.train recipes/mixtral/tiny.yaml")
    assert ran == [[sys.executable, "-m", "tools.explore", "--help"],
                   ["print-config", "recipes/llama/tiny.yaml", "train.max_steps=2"],
                   [_which("accelerate"), "launch", "--help"], ["print-config", "recipes/mixtral/tiny.yaml"]]
    assert _problems("accelerate launch --config_file recipes/launch/nowhere.yaml -m archlab.train x.yaml") == [
        "no such path: recipes/launch/nowhere.yaml"]


def test_an_invalid_override_fails_the_print_config_check():
    assert _problems("python -m archlab.train recipes/llama/tiny.yaml model.no_such_key=1")[0].startswith(
        "--print-config exited 2")


def test_installs_are_checked_against_what_is_installed_and_declared():
    assert _problems("pip install -e '.[test]'") == []
    assert _problems("pip install -e '.[nothing]'") == ["archlab declares no extra 'nothing'"]
    assert _problems("pip install torch==0.0.1")[0].endswith("the docs pin 0.0.1")
    assert _problems("source .venv-x/bin/activate", before=["python3 -m venv .venv-x"]) == []
    assert _problems("source .nowhere/bin/activate") == [".nowhere/bin/activate: no virtual environment made before it"]


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links() -> list[tuple[str, str, str]]:
    """(doc, target file, anchor) for every relative link of the README and the guides."""
    out = []
    for doc in DOCS:
        text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
        for m in re.finditer(r"\]\(([^)\s]+)\)", text):
            target, _, anchor = m.group(1).partition("#")
            if not re.match(r"^[a-z]+:", target):
                out.append((str(doc.relative_to(ROOT)), str((doc.parent / (target or doc.name)).resolve()
                                                                .relative_to(ROOT)), anchor))
    return out


@pytest.mark.parametrize("doc, target, anchor", _links(), ids=lambda v: v)
def test_every_link_resolves(doc, target, anchor):
    assert (ROOT / target).exists(), f"{doc} links to {target}, which does not exist"
    if anchor:
        assert anchor in _anchors(ROOT / target), f"{doc} links to {target}#{anchor}: no such heading"


def test_the_slug_is_githubs():
    assert _slug("Several processes on one machine: DDP, ZeRO, expert parallelism") == \
        "several-processes-on-one-machine-ddp-zero-expert-parallelism"
    assert _slug("`model.moe`") == "modelmoe"
