"""``python -m tools.export_hf ... --verify``: reload an exported folder with the transformers Auto class of its
family and check that its logits equal archlab's on random ids.

Shape legend: B batch, M encoder positions, S (decoder) positions, V vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

# model.type -> the transformers Auto class that loads its export (GPT-2 / LLaMA / MoE, BERT, T5)
AUTO_CLASSES = {"decoder": AutoModelForCausalLM, "encoder": AutoModelForMaskedLM,
                "encoder_decoder": AutoModelForSeq2SeqLM}


def _logits(model, hf, ids_BM: torch.Tensor, dec_BS: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """archlab's and HF's logits (B, S, V) on the same ids: an encoder-decoder reads ``ids_BM`` in its encoder and
    ``dec_BS`` in its decoder; any other model reads ``ids_BM`` alone."""
    with torch.no_grad():
        if model.cfg.type == "encoder_decoder":
            return model(ids_BM, dec_BS).logits, hf(input_ids=ids_BM, decoder_input_ids=dec_BS).logits
        return model(ids_BM).logits, hf(ids_BM).logits


def verify(model, out: Path, seq_len: int = 32) -> float:
    """Max |logit difference| between archlab's ``model`` and the HF model in ``out``; AssertionError if not close
    (``torch.testing.assert_close``'s float32 tolerances)."""
    hf = AUTO_CLASSES[model.cfg.type].from_pretrained(out, dtype=torch.float32).eval()
    model = model.float().eval()
    n = min(seq_len, model.cfg.max_seq_len)
    ids_BM = torch.randint(0, model.cfg.vocab_size, (2, n))
    dec_BS = torch.randint(0, model.cfg.vocab_size, (2, max(1, n // 2)))
    ours, theirs = _logits(model, hf, ids_BM, dec_BS)
    torch.testing.assert_close(theirs, ours)
    return float((ours - theirs).abs().max())
