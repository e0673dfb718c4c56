"""``train.compile: true`` through the real trainer: 20 compiled steps (default backend, inductor)
follow the eager run's losses, for a dense and an MoE family, with no graph break on the way.

Tolerance: rtol 1e-4 on the per-step losses (fp32 throughout). Inductor fuses and reorders
reductions (norms, softmax, the cross-entropy's sums), so each compiled step differs from eager
by fp32 rounding, ~1e-7 relative, and 20 AdamW steps carry that forward: measured 2e-7 at most.
1e-4 leaves a margin of ~500 over that, yet a real difference fails it by far: dropping the
balancing terms (aux loss ~1e-2 of the loss), a stale expert bias or one wrong gradient moves the
loss by 1e-3 or more within a few steps. The aux losses (``aux_loss``, ~1e-4 nats for DeepSeek's
sequence-wise term) are compared with the same rtol.

Slow: inductor's C++ compilation of forward and backward takes ~30-40 s per model on a 2-core CPU.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from archlab.train import train

STEPS = ["train.max_steps=20", "train.eval_every=100", "train.ckpt_every=100", "train.eval_context_multipliers=[1]"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["dense/tiny", "deepseek/tiny"])
def test_compiled_training_losses_follow_eager(tiny_cfg, rows, recipe):
    eager = rows(train(tiny_cfg(*STEPS, "train.run_name=eager", recipe=recipe))["run_dir"])
    torch._dynamo.reset()
    counters.clear()
    compiled = rows(train(tiny_cfg(*STEPS, "train.run_name=compiled", "train.compile=true", recipe=recipe))["run_dir"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert len(eager) == len(compiled) == 20
    for key in ("loss", "aux_loss"):
        a = torch.tensor([r[key] for r in compiled], dtype=torch.float64)
        b = torch.tensor([r[key] for r in eager], dtype=torch.float64)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=0.0)
    if recipe.startswith("deepseek"):  # routing statistics are recorded by the compiled forward
        assert all(sum(r["moe/layer1/tokens_per_expert"]) == r["moe/layer1/tokens"] * 6 for r in compiled)
