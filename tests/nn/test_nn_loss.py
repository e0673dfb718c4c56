"""The chunked LM-head cross-entropy equals the reference loss on the logits h @ W^T
(``archlab.nn.loss.lm_loss``) in value and gradients."""

import pytest
import torch

import archlab
from archlab.config.schema import ModelConfig
from archlab.nn.loss import linear_cross_entropy, lm_loss


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_value_and_gradients_equal_the_plain_loss(chunk):
    h = torch.randn(50, 16, requires_grad=True)
    w = (torch.randn(30, 16) * 0.3).requires_grad_()
    t = torch.randint(0, 30, (50,))
    t[[3, 10, 11]] = -100  # ignored positions
    ref = lm_loss(h @ w.T, t)
    ref_gh, ref_gw = torch.autograd.grad(ref * 2.5, (h, w))
    loss = linear_cross_entropy(h, w, t, chunk=chunk)
    gh, gw = torch.autograd.grad(loss * 2.5, (h, w))  # a non-unit upstream gradient
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gh, ref_gh)
    torch.testing.assert_close(gw, ref_gw)


def test_no_grad_inputs_and_bad_shapes():
    h, w, t = torch.randn(8, 4), torch.randn(5, 4), torch.randint(0, 5, (8,))
    torch.testing.assert_close(linear_cross_entropy(h, w, t), lm_loss(h @ w.T, t))
    with pytest.raises(ValueError, match="expected h"):
        linear_cross_entropy(h[None], w, t)


def test_decoder_targets_give_the_loss_of_its_logits_and_the_same_gradients():
    c = ModelConfig(vocab_size=40, max_seq_len=16, d_model=32, n_layers=1, n_heads=4, tie_embeddings=True)
    model = archlab.build_model(c)
    ids = torch.randint(0, 40, (2, 9))
    logits = model(ids[:, :-1]).logits
    ref = lm_loss(logits, ids[:, 1:])
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    out = model(ids[:, :-1], targets=ids[:, 1:])
    assert out.logits is None
    torch.testing.assert_close(out.loss, ref)
    for g, r in zip(torch.autograd.grad(out.loss, list(model.parameters())), ref_grads):
        torch.testing.assert_close(g, r)


def test_loss_far_beyond_exp_underflow_is_exact():
    """Targets 200 nats below the best logit: their probability underflows fp32 to 0, yet the
    loss (read off the largest probability, not the target's) and the gradients are the reference."""
    h = torch.tensor([[100.0, 0.0], [0.0, 3.0], [-100.0, 1.0]], requires_grad=True)
    w = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    t = torch.tensor([1, 0, 0])
    ref = lm_loss(h @ w.T, t)
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    loss = linear_cross_entropy(h, w, t, chunk=2)
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert loss.item() > 100
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(gh, ref_gh)
    torch.testing.assert_close(gw, ref_gw)


def test_bf16_inputs_keep_their_dtype_and_follow_the_fp32_reference():
    h = (torch.randn(40, 16) * 2).bfloat16().requires_grad_()
    w = torch.randn(30, 16).bfloat16().requires_grad_()
    t = torch.randint(0, 30, (40,))
    loss = linear_cross_entropy(h, w, t, chunk=16)
    gh, gw = torch.autograd.grad(loss, (h, w))
    assert loss.dtype == torch.float32 and gh.dtype == gw.dtype == torch.bfloat16
    ref = lm_loss(h.float() @ w.float().T, t)
    ref_gh, ref_gw = torch.autograd.grad(ref, (h, w))
    torch.testing.assert_close(loss, ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh, ref_gh, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw, ref_gw, rtol=2e-2, atol=2e-3)


def test_no_tokens_give_zero_loss_and_zero_gradients():
    h, w = torch.randn(0, 8, requires_grad=True), torch.randn(5, 8, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0 and w.grad.abs().sum() == 0 and h.grad.shape == (0, 8)


@pytest.mark.parametrize("chunk", [1, 7, 1000])
@pytest.mark.parametrize("compiled_form", [False, True])
def test_an_output_bias_gives_the_loss_and_gradients_of_the_biased_logits(chunk, compiled_form, monkeypatch):
    """BERT's MLM head: logits h W^T + b. Both forms (eager and the one torch.compile traces) against
    cross-entropy on F.linear(h, W, b), most targets ignored as in masked-token prediction."""
    import archlab.nn.loss as loss_module

    if compiled_form:
        monkeypatch.setattr(loss_module.torch.compiler, "is_compiling", lambda: True)
    g = torch.Generator().manual_seed(0)
    h = torch.randn(40, 8, generator=g).requires_grad_()
    w = (torch.randn(30, 8, generator=g) * 0.3).requires_grad_()
    b = torch.randn(30, generator=g).requires_grad_()
    t = torch.randint(0, 30, (40,), generator=g)
    t[torch.rand(40, generator=g) < 0.8] = -100
    ref = lm_loss(torch.nn.functional.linear(h, w, b), t)
    ref_grads = torch.autograd.grad(ref * 1.5, (h, w, b))
    loss = linear_cross_entropy(h, w, t, chunk=chunk, bias_V=b)
    grads = torch.autograd.grad(loss * 1.5, (h, w, b))
    torch.testing.assert_close(loss, ref)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)
