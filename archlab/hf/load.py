"""Import a local Hugging Face model folder as an archlab run folder (what ``python -m archlab.train`` writes).

    archlab.from_hf("~/gpt2", "runs/gpt2")      # config.json + *.safetensors (+ tokenizer.json)

The family is config.json's ``model_type``, its adapter (``archlab/hf/adapters/<family>.py``) maps the config
onto the recipe's ``model`` node (refusing a key archlab cannot express by name) and the weights onto archlab's
tensors. The run folder (docs/run-folder.md) gets ``run.json``, ``recipe.yaml``, one checkpoint
``checkpoints/step_00000000/`` (``model.safetensors``, ``state.json``, ``recipe.yaml``, ``manifest.json``)
and the folder's ``tokenizer.json``; it is built beside ``out`` and renamed into place, so a failed import
leaves nothing under that name. Every tool that reads a run reads it: ``tools.sample``, ``tools.explore``,
``tools.export_hf``, ``train.init_from`` (fine-tuning).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional, Union

import torch
from omegaconf import OmegaConf

from archlab import checkpoints as ckpt
from archlab.config.load import load_recipe
from archlab.hf.adapter import ADAPTERS, HFAdapter, refuse
from archlab.io import publish_folder, write_json_atomic
from archlab.model.build import build_model
from archlab.version import __version__

EOS = "<|endoftext|>"  # archlab's end-of-text token (archlab.data.tokenizer)
DEFAULT_SEQ_LEN = 256  # train.seq_len of the imported recipe, at most the model's max_seq_len
OBJECTIVES = {"decoder": "causal_lm", "encoder": "mlm", "encoder_decoder": "span_corruption"}  # by model.type


def read_hf_config(folder: Path) -> dict:
    """config.json with the family's defaults filled in (``transformers``' own config class)."""
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json (a Hugging Face model folder has one)")
    model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    if model_type not in ADAPTERS:
        raise refuse("model_type", model_type, ", ".join(ADAPTERS.names()))
    raw = json.loads((folder / "config.json").read_text())
    # the class's defaults for keys the file leaves out; the file's own values win (a class may overrule one)
    return {**AutoConfig.from_pretrained(folder, local_files_only=True).to_dict(), **raw}


def hf_state_dict(adapter: HFAdapter, folder: Path) -> dict[str, torch.Tensor]:
    """The folder's weights as the HF class names them (``from_pretrained`` resolves prefixes and ties)."""
    if not list(folder.glob("*.safetensors")):
        raise FileNotFoundError(f"{folder}: no *.safetensors weights (archlab reads safetensors only)")
    hf = adapter.hf_class().from_pretrained(folder, local_files_only=True)
    return {k: v.detach().float() for k, v in hf.state_dict().items()}


def recipe_node(folder: Path, out: Path, c: dict, node: dict, tokenizer: Optional[Path],
                eot_id: Optional[int]) -> dict:
    """The whole recipe of an imported model: its ``model`` node, a train length it fits and, with a tokenizer,
    the run's copy of it (so training this recipe on text uses it) and its end-of-text id when that is not
    ``<|endoftext|>``."""
    data: dict = {"tokenizer": str(out.resolve() / ckpt.TOKENIZER)} if tokenizer is not None else {}
    if eot_id is not None:
        data["eot_id"] = eot_id
    train = {"seq_len": min(DEFAULT_SEQ_LEN, node["max_seq_len"]), "objective": OBJECTIVES[node["type"]]}
    if node["type"] == "encoder_decoder":
        train["eval_context_multipliers"] = [1]  # span corruption evaluates at the training length only
    return {"name": out.name, "family": "custom",
            "description": f"imported from {folder} ({c['model_type']}, {', '.join(c.get('architectures') or [])})",
            "model": node, "data": data, "train": train}


def tokenizer_eot(folder: Path, c: dict, vocab_size: int) -> tuple[Optional[Path], Optional[int]]:
    """(tokenizer.json or None, the end-of-text id to record when the file has no ``<|endoftext|>``)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None, None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    if tok.get_vocab_size() > vocab_size:
        raise ValueError(f"{path}: {tok.get_vocab_size()} token ids, more than the model's vocab_size {vocab_size}")
    if tok.token_to_id(EOS) is not None:
        return path, None
    eos = c.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    if eos is None:
        raise ValueError(f"{path}: no {EOS} token and config.json has no eos_token_id: archlab's tokenizer needs "
                         "an end-of-text id (add eos_token_id to config.json)")
    return path, int(eos)


def from_hf(folder: Union[str, Path], out: Union[str, Path], force: bool = False) -> Path:
    """Write the Hugging Face model in ``folder`` as the archlab run folder ``out`` (see the module docstring);
    an existing ``out`` is refused unless ``force``. Returns ``out``."""
    folder, out = Path(folder).expanduser(), Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out} already exists; choose another folder or pass --force to replace it")
    c = read_hf_config(folder)
    adapter = ADAPTERS.get(c["model_type"])()
    node = adapter.from_hf_config(c)
    tok_path, eot_id = tokenizer_eot(folder, c, node["vocab_size"])
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        recipe = recipe_node(folder, out, c, node, tok_path, eot_id)
        (tmp / ckpt.RECIPE).write_text(OmegaConf.to_yaml(OmegaConf.create(recipe)))
        cfg = load_recipe(tmp / ckpt.RECIPE)  # defaults filled in, every rule checked
        model = build_model(cfg)
        why = adapter.matches(model.cfg)
        if why is not None:  # the import maps onto a model this family exports back exactly
            raise RuntimeError(f"{type(adapter).__name__}: the imported model is not {adapter.hf_class_name}: {why}")
        hf_sd = adapter.prepare_hf(hf_state_dict(adapter, folder), c)
        adapter.from_hf(model, hf_sd)
        write_run(tmp, out.name, cfg, model, folder, c)
        if tok_path is not None:
            shutil.copyfile(tok_path, tmp / ckpt.TOKENIZER)
        publish_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_run(run: Path, name: str, cfg, model, folder: Path, c: dict) -> None:
    """The trainer's run-folder files for a model at step 0: run.json, recipe.yaml, one checkpoint."""
    source = {"hf_folder": str(folder.resolve()), "model_type": c["model_type"]}
    write_json_atomic(run / ckpt.RUN_MARKER, {"archlab_run": 1, "name": name, "created": time.time(),
                                              "imported_from": source})
    ckpt.save_recipe(cfg, run / ckpt.RECIPE)
    step_dir = ckpt.begin(run, 0)
    ckpt.save_model_weights(model, step_dir / ckpt.WEIGHTS)
    write_json_atomic(step_dir / ckpt.STATE, {"step": 0, "tokens": 0, "elapsed_s": 0.0, "world_size": 1,
                                              "archlab_version": __version__, "branch": None,
                                              "imported_from": source})
    ckpt.save_recipe(cfg, step_dir / ckpt.RECIPE)
    ckpt.finish(run, 0, keep_last=1)
