"""``python -m analysis.routing RUN --text ...`` on Hugging Face MoE checkpoints imported with ``archlab.from_hf``:
the load per expert and layer it reports is the count of the HF model's own router choices over the same ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import archlab
from analysis.routing.cli import main

TEXT = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n    y: int = 0\n"
EOT = "<|endoftext|>"
E, K, LAYERS = 4, 2, 2


def _tokenizer(folder: Path) -> Tokenizer:
    """A byte-level BPE of ~300 ids trained on a few lines, saved as ``folder/tokenizer.json``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TEXT, "the cat sat on the mat"] * 10, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def _hf_model(family: str, vocab: int, eot: int):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                  num_experts_per_tok=K, initializer_range=0.3, bos_token_id=eot, eos_token_id=eot)
    if family == "mixtral":
        cfg = transformers.MixtralConfig(num_local_experts=E, **common)
        return transformers.MixtralForCausalLM(cfg)
    cfg = transformers.Qwen3MoeConfig(num_experts=E, moe_intermediate_size=32, norm_topk_prob=True, head_dim=16,
                                      **common)
    return transformers.Qwen3MoeForCausalLM(cfg)


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_routing_of_an_imported_moe_counts_the_hf_routers_choices(family, tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    tok = _tokenizer(hf_dir)
    torch.manual_seed(0)
    hf = _hf_model(family, tok.get_vocab_size(), tok.token_to_id(EOT)).eval()
    hf.save_pretrained(hf_dir)
    run = archlab.from_hf(hf_dir, tmp_path / "runs" / family)

    out = tmp_path / "routing"
    assert main([str(run), "--out", str(out), "--text", TEXT]) == 0
    ck = json.loads((out / "summary.json").read_text())["checkpoint"]

    ids = tok.encode(TEXT).ids
    assert ck["tokens"] == len(ids) < 128  # one window: the HF model sees the same context
    with torch.no_grad():
        router_logits = hf(torch.tensor([ids]), output_router_logits=True).router_logits
    assert len(router_logits) == LAYERS
    for layer, logits_NE in zip(sorted(ck["load"]), router_logits):
        chosen_NK = logits_NE.view(-1, E).topk(K, dim=-1).indices
        theirs = np.bincount(chosen_NK.reshape(-1).numpy(), minlength=E).tolist()
        assert ck["load"][layer]["slots_per_expert"] == theirs
        assert sum(theirs) == K * len(ids)
