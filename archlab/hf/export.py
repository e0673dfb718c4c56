"""Write an archlab model as a Hugging Face ``transformers`` model folder (the family's adapter: ``find_adapter``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional, Union

from archlab.hf.adapter import find_adapter
from archlab.io import publish_folder


def to_hf_model(model, eos_id: Optional[int] = None):
    """An HF model (fp32, eval mode) holding ``model``'s weights; its logits equal archlab's.

    archlab has one special token, end-of-text; ``eos_id`` (when known) is both HF's bos and eos.
    """
    adapter = find_adapter(model.cfg)
    config = adapter.to_hf_config(model.cfg)
    config.bos_token_id = config.eos_token_id = eos_id
    config.pad_token_id = None
    hf = adapter.hf_class()(config).float()
    sd = adapter.finish_hf({k: v.detach().float().contiguous() for k, v in adapter.to_hf(model).items()})
    missing, unexpected = hf.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (k == adapter.tied_head_key and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"{adapter.hf_class_name} state dict mismatch: missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        hf.tie_weights()
    return hf.eval()


def export_hf(
    model,
    out_dir: Union[str, Path],
    tokenizer_file: Optional[Union[str, Path]] = None,
    eos_id: Optional[int] = None,
    overwrite: bool = False,
) -> Path:
    """Write ``model`` as a folder that ``AutoModelForCausalLM.from_pretrained`` loads (an encoder:
    ``AutoModelForMaskedLM``).

    Weights go through ``save_pretrained`` (safetensors). With ``tokenizer_file`` (a ``tokenizers``
    JSON), the folder also gets a fast tokenizer. The folder is written next to ``out_dir`` and
    renamed into place, so a crash never leaves half a model under that name.
    """
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists; choose another folder or pass overwrite=True (--force)")
    hf = to_hf_model(model, eos_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        hf.save_pretrained(tmp)
        if tokenizer_file is not None:
            _save_tokenizer(Path(tokenizer_file), tmp, eos_id)
        publish_folder(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _save_tokenizer(tokenizer_file: Path, folder: Path, eos_id: Optional[int]) -> None:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))
    if eos_id is not None:
        tok.eos_token = tok.convert_ids_to_tokens(eos_id)
    tok.save_pretrained(folder)
