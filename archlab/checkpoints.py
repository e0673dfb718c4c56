"""Checkpoint folders: atomic, verifiable, and loadable without executing pickled code (the files only:
``archlab.train.checkpoint`` rebuilds a model from one).

Layout of one checkpoint (``<run>/checkpoints/step_00000100/``)::

    model.safetensors   consolidated model weights (safetensors: tensors only, no code; under ZeRO-3
                        gathered from every rank's partition)
    optimizer.pt        AdamW state (tensors and numbers; loaded with torch.load(weights_only=True))
    zero/               DeepSpeed only: the engine's sharded optimizer state, one file per rank
    optimizer_rank<r>.pt  expert parallelism: rank r's AdamW state (its own experts), instead of zero/
    rng_rank<r>.pt      torch (and CUDA) RNG state of rank r, python ``random`` state
    state.json          step, tokens seen, world size, elapsed time...
    recipe.yaml         the resolved recipe, so a checkpoint folder stands on its own
    manifest.json       size and sha256 of every file above; written LAST

The folder is built as ``step_XXXXXXXX.tmp`` and renamed into place with ``os.replace`` once its
manifest is written, so a crash while saving leaves at most a ``.tmp`` folder that nothing reads;
the previous checkpoint stays intact. A checkpoint is *complete* when its manifest exists and
every file matches it; :func:`verify` raises :class:`CheckpointError` naming the first file
that does not.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable, Optional, Union

import torch
from omegaconf import DictConfig, OmegaConf
from safetensors.torch import load_model as _load_safetensors_into
from safetensors.torch import save_file as _save_file

from archlab.io import write_json_atomic, write_text_atomic  # noqa: F401  (used by run_folder too)

CKPT_DIR = "checkpoints"
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"
OPTIMIZER = "optimizer.pt"
STATE = "state.json"
RECIPE = "recipe.yaml"
RUN_MARKER = "run.json"
TOKENIZER = "tokenizer.json"  # the run folder's tokenizer (beside checkpoints/)
_STEP_RE = re.compile(r"^step_(\d{8})$")

PathLike = Union[str, Path]


class CheckpointError(ValueError):
    """A checkpoint or run folder is missing, incomplete, corrupt or of the wrong kind."""


# ----------------------------------------------------------------------------- small file helpers

def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def _entry(path: Path) -> dict:
    return {"bytes": path.stat().st_size, "sha256": _sha256(path)}


def hash_share(folder: PathLike, rank: int, world_size: int) -> dict[str, dict]:
    """The manifest entries (size, sha256) of rank ``rank``'s share of the files in ``folder``: the files
    dealt largest first to the rank with the fewest bytes so far, so that ``world_size`` ranks hash a
    checkpoint together in about 1/world_size of the time one takes (every rank lists the same files)."""
    folder = Path(folder)
    sizes = {name: (folder / name).stat().st_size for name in _files_under(folder)}
    load = [0] * world_size
    mine = []
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        r = min(range(world_size), key=lambda i: (load[i], i))
        load[r] += sizes[name]
        if r == rank:
            mine.append(name)
    return {name: _entry(folder / name) for name in mine}


# ----------------------------------------------------------------------------- finding checkpoints

def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def is_checkpoint_dir(path: PathLike) -> bool:
    return (Path(path) / MANIFEST).is_file() or bool(_STEP_RE.match(Path(path).name))


def is_run_dir(path: PathLike) -> bool:
    return (Path(path) / RUN_MARKER).is_file()


def checkpoints(run_dir: PathLike) -> list[Path]:
    """Checkpoint folders of a run that carry a manifest, oldest first (not yet verified)."""
    root = Path(run_dir) / CKPT_DIR
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _STEP_RE.match(p.name) and (p / MANIFEST).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest(run_dir: PathLike) -> Optional[Path]:
    """The newest checkpoint of ``run_dir`` that verifies as complete, or None.

    Corrupt ones are skipped; use :func:`latest_valid` to learn which and why.
    """
    return latest_valid(run_dir)[0]


def latest_valid(run_dir: PathLike) -> tuple[Optional[Path], list[str]]:
    """(newest complete checkpoint or None, one message per newer checkpoint that failed)."""
    problems = []
    for ckpt in reversed(checkpoints(run_dir)):
        try:
            verify(ckpt)
            return ckpt, problems
        except CheckpointError as e:
            problems.append(str(e))
    return None, problems


def verify(ckpt_dir: PathLike) -> dict:
    """Check every file of a checkpoint against its manifest; return the manifest.

    Raises :class:`CheckpointError` naming the missing, truncated or altered file.
    """
    ckpt_dir = Path(ckpt_dir)
    mpath = ckpt_dir / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{ckpt_dir}: not a complete checkpoint ({MANIFEST} is missing)")
    try:
        manifest = json.loads(mpath.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{mpath}: unreadable manifest ({e})") from None
    for name, meta in files.items():
        f = ckpt_dir / name
        if not f.is_file():
            raise CheckpointError(f"{f}: missing from checkpoint")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(f"{f}: truncated or altered ({size} bytes, manifest says {meta['bytes']})")
        if _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{f}: corrupt (sha256 does not match the manifest)")
    return manifest


# ----------------------------------------------------------------------------- saving

def begin(run_dir: PathLike, step: int) -> Path:
    """Create (afresh) the temporary folder a checkpoint of ``step`` is built in. Main process only."""
    tmp = Path(run_dir) / CKPT_DIR / (step_dir_name(step) + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def tmp_dir(run_dir: PathLike, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / (step_dir_name(step) + ".tmp")


def save_model_weights(model: Union[torch.nn.Module, dict], path: Path) -> None:
    """Weights (of a module, or a state dict such as the consolidated one of an expert-parallel
    model) as safetensors; tied tensors (embedding = LM head) are stored once, under their
    first name. Tensors are copied out first: under DeepSpeed ZeRO the parameters are views
    into one flat buffer, which safetensors refuses to store as is."""
    first_name: dict[tuple, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    state = model if isinstance(model, dict) else model.state_dict()
    for name, t in state.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key in first_name:  # a tied alias: load_model restores it from the kept name
            continue
        first_name[key] = name
        tensors[name] = t.detach().to("cpu", copy=True).contiguous()
    _save_file(tensors, str(path), metadata={"format": "pt"})


def save_rng(folder: Path, rank: int) -> None:
    import random

    state = {"torch": torch.get_rng_state(), "python": _to_lists(random.getstate())}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(state, folder / f"rng_rank{rank}.pt")


def _to_lists(obj):
    return [_to_lists(o) for o in obj] if isinstance(obj, (tuple, list)) else obj


def _to_tuples(obj):
    return tuple(_to_tuples(o) for o in obj) if isinstance(obj, list) else obj


def finish(run_dir: PathLike, step: int, keep_last: int, keep_steps: Iterable[int] = (),
           hashes: Optional[dict[str, dict]] = None) -> Path:
    """Write the manifest, rename the temporary folder into place, prune to ``keep_last`` (sparing
    the checkpoints at ``keep_steps``, see :func:`prune`). ``hashes``: entries the ranks computed
    (:func:`hash_share`), used where the file still has that size; the other files are hashed here.

    Main process only, after every rank has written its files.
    """
    tmp = tmp_dir(run_dir, step)
    hashes = hashes or {}
    files = {}
    for name in _files_under(tmp):
        given = hashes.get(name)
        fits = given is not None and given["bytes"] == (tmp / name).stat().st_size
        files[name] = given if fits else _entry(tmp / name)
    write_json_atomic(tmp / MANIFEST, {"step": step, "files": files})
    final = tmp.with_name(step_dir_name(step))
    if final.exists():  # a re-save of the same step (e.g. after a resume): replace it
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    _fsync_dir(final.parent)
    prune(run_dir, keep_last, keep_steps)
    return final


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def prune(run_dir: PathLike, keep_last: int, keep_steps: Iterable[int] = ()) -> None:
    """Delete all but the newest ``keep_last`` complete checkpoints and any stale ``.tmp`` folder.

    Checkpoints at ``keep_steps`` (``train.ckpt_steps``: the branch points of WSD cooldowns) are
    never deleted and do not count toward ``keep_last``.
    """
    root = Path(run_dir) / CKPT_DIR
    for stale in root.glob("step_*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    kept = {step_dir_name(int(s)) for s in keep_steps}
    for old in [c for c in checkpoints(run_dir) if c.name not in kept][:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


# ----------------------------------------------------------------------------- loading

def _safe_torch_load(path: Path):
    """``torch.load`` restricted to tensors and plain containers: a file crafted to run code on
    unpickling is refused, not executed."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # pickle.UnpicklingError, RuntimeError from a truncated zip...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path}: refused or unreadable (only tensors and plain data are loaded): {first}") from None


def load_state(ckpt_dir: PathLike) -> dict:
    path = Path(ckpt_dir) / STATE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable ({e})") from None


def load_weights_into(model: torch.nn.Module, ckpt_dir: PathLike) -> None:
    path = Path(ckpt_dir) / WEIGHTS
    try:
        missing, unexpected = _load_safetensors_into(model, str(path), strict=False)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load weights ({str(e).splitlines()[0]})") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit this model "
            f"(missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}); "
            "the checkpoint belongs to a different model recipe")


def load_optimizer_state(ckpt_dir: PathLike, name: str = OPTIMIZER) -> dict:
    return _safe_torch_load(Path(ckpt_dir) / name)


def rank_optimizer_name(rank: int) -> str:
    """Expert parallelism: each rank's optimizer state (it holds only its own experts)."""
    return f"optimizer_rank{rank}.pt"


def load_rng(ckpt_dir: PathLike, rank: int) -> bool:
    """Restore this rank's RNG state; False if the checkpoint has none for this rank."""
    import random

    path = Path(ckpt_dir) / f"rng_rank{rank}.pt"
    if not path.is_file():
        return False
    state = _safe_torch_load(path)
    torch.set_rng_state(state["torch"])
    random.setstate(_to_tuples(state["python"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    return True


def resolve_checkpoint(path: PathLike) -> Path:
    """A checkpoint folder, or the newest complete checkpoint of a run folder, verified."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such run folder or checkpoint")
    if (path / MANIFEST).is_file() or _STEP_RE.match(path.name):
        verify(path)
        return path
    if not is_run_dir(path):
        raise CheckpointError(f"{path}: not an archlab run folder ({RUN_MARKER} missing) nor a checkpoint folder")
    ckpt, problems = latest_valid(path)
    if ckpt is None:
        detail = f" ({'; '.join(problems)})" if problems else ""
        raise CheckpointError(f"{path}: no complete checkpoint in this run{detail}")
    return ckpt


def save_recipe(cfg: DictConfig, path: Path) -> None:
    write_text_atomic(path, OmegaConf.to_yaml(cfg, resolve=True))
