"""archlab.model.token_heads: per-token logits on each model type's final states; GPT's see only the left."""

from __future__ import annotations

import pytest
import torch

import archlab
from archlab.config.schema import model_config
from archlab.model.token_heads import SpanExtractor, TokenTagger

SMALL = ["model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.dropout=0.0"]


def cfg_of(kind: str):
    return model_config(archlab.load_recipe(f"recipes/finetune/{kind}-understand.yaml", SMALL))


@pytest.mark.parametrize("kind,sees_right", [("gpt", False), ("bert", True), ("t5", True)])
def test_per_token_logits_and_what_each_position_sees(kind, sees_right):
    model = TokenTagger(cfg_of(kind), 6).eval()
    x = torch.randint(0, 200, (2, 16))
    out = model(x)
    assert out.logits.shape == (2, 16, 6) and out.aux_loss.ndim == 0
    y = x.clone()
    y[:, -1] = (y[:, -1] + 1) % 200  # change the last token only
    earlier_changed = not torch.allclose(model(y).logits[:, :-1], out.logits[:, :-1], atol=1e-6)
    assert earlier_changed == sees_right


def test_the_span_head_is_two_logits_per_position_and_the_trunk_keeps_its_names():
    model = SpanExtractor(cfg_of("bert"))
    assert model(torch.randint(0, 200, (3, 12))).logits.shape == (3, 12, 2)
    assert "trunk.embed.weight" in model.state_dict() and model.out.weight.shape == (2, 32)
