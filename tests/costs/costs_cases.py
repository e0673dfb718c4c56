"""Recipes and randomised configs for the cost-model tests (imported by the test modules)."""

from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# The measured sweeps build each recipe at its shrunk depth with real weights and run it on the CPU; above
# this many parameters (the recipes at 760M and beyond: 137M-872M parameters even at 1-2 layers) a single
# test takes minutes and gigabytes. Those recipes repeat the architectures of the ladder measured here; their
# counts are checked on the meta device (tests/test_recipes_scale.py) and their memory at full size against
# torch's own accounting under FakeTensorMode (tests/costs/test_costs_plan.py).
MEASURED_MAX_PARAMS = 100_000_000


def model_recipes(measured: bool = True) -> list[Path]:
    """Every model recipe (recipes/launch holds accelerate/DeepSpeed launch configs, not recipes; recipes/finetune
    fine-tunes its base recipes' models with a classification head, whose cost model is not derived); with
    ``measured``, only those whose shrunk model (:func:`shrink`) holds at most ``MEASURED_MAX_PARAMS``."""
    paths = sorted(p for p in (ROOT / "recipes").glob("*/*.yaml") if p.parent.name not in ("launch", "finetune"))
    return [p for p in paths if not measured or _shrunk_params(p) <= MEASURED_MAX_PARAMS]


def _shrunk_params(path) -> int:
    import archlab
    from archlab.costs import param_counts

    return param_counts(archlab.model_config(archlab.load_recipe(path, shrink(path)))).total


def shrink(path) -> list[str]:
    """Overrides that keep a recipe's architecture but only the layers its pattern needs.

    Every cost is a sum over layers, and layers past ``first_k_dense + every`` (MoE: the dense
    first layers, one MoE layer, the dense layers up to the next MoE one) or past the second
    (dense) repeat the ones before, rounded up to whole periods of a layer pattern; the tests run
    on this depth to stay fast.
    """
    import archlab

    m = archlab.model_config(archlab.load_recipe(path))
    keep = 2 if m.moe is None else m.moe.first_k_dense + m.moe.every
    period = len(m.layers.pattern) or 1  # a layer pattern (a hybrid) repeats whole: one period at least
    return [f"model.n_layers={min(m.n_layers, -(-keep // period) * period)}"]


def random_overrides(seed: int, moe: bool) -> list[str]:
    """A random valid model (dense or MoE) as overrides of the schema defaults.

    Widths are multiples of 8 so that MoE experts take the grouped-GEMM path (exact routed
    rows); dropless routing, so every token visits exactly K experts.
    """
    rng = random.Random(seed)
    n_heads = rng.choice([2, 4])
    d_head = rng.choice([8, 16])
    pos = rng.choice(["learned", "sinusoidal", "rope", "alibi", "none"])
    ffn = rng.choice(["gelu", "relu", "swiglu"])
    n_layers = rng.choice([1, 2, 3])
    o = [
        "model.vocab_size=512", "model.max_seq_len=64", "train.seq_len=32", f"model.n_layers={n_layers}",
        f"model.n_heads={n_heads}", f"model.d_model={n_heads * d_head}",
        f"model.n_kv_heads={rng.choice([h for h in (1, 2, 4) if n_heads % h == 0])}",
        f"model.norm.type={rng.choice(['layernorm', 'rmsnorm'])}",
        f"model.norm.placement={rng.choice(['pre', 'post'])}",
        f"model.position.type={pos}", f"model.ffn.type={ffn}",
        f"model.ffn.hidden={rng.choice(['null', 24, 40])}",
        f"model.ffn.bias={rng.choice(['true', 'false'])}", f"model.attention.bias={rng.choice(['true', 'false'])}",
        f"model.attention.qk_norm={rng.choice(['true', 'false'])}",
        f"model.tie_embeddings={rng.choice(['true', 'false'])}",
        f"model.dropout={rng.choice([0.0, 0.1])}", f"model.ffn.dropout={rng.choice([0.0, 0.1])}",
        f"model.attention.dropout={rng.choice([0.0, 0.0, 0.1])}",
    ]
    if moe:
        E = rng.choice([4, 8])
        groups = rng.choice([g for g in (1, 2, 4) if E % g == 0])
        top_k = rng.randint(1, min(3, E))
        kept = rng.choice([k for k in range(1, groups + 1) if k * (E // groups) >= top_k])
        o += [
            f"model.moe.num_experts={E}", f"model.moe.top_k={top_k}",
            f"model.moe.expert_hidden={rng.choice([8, 16, 24])}",
            f"model.moe.n_shared_experts={rng.choice([0, 1, 2])}",
            f"model.moe.first_k_dense={rng.choice([0, 0, 1]) if n_layers > 1 else 0}",
            f"model.moe.every={rng.choice([1, 2])}",
            f"model.moe.router.type={rng.choice(['softmax_topk', 'sigmoid_topk'])}",
            f"model.moe.router.renormalize={rng.choice(['true', 'false'])}",
            f"model.moe.router.n_groups={groups}", f"model.moe.router.topk_groups={kept}",
            f"model.moe.router.jitter={rng.choice([0.0, 0.1])}",
            f"model.moe.balance.aux_loss_coeff={rng.choice([0.0, 0.01])}",
            f"model.moe.balance.seq_aux_loss_coeff={rng.choice([0.0, 0.01])}",
            f"model.moe.balance.z_loss_coeff={rng.choice([0.0, 0.001])}",
            f"model.moe.balance.bias_update_rate={rng.choice([0.0, 0.001])}",
        ]
    o.append(f"model.attention.output_gate={rng.choice(['true', 'false'])}")  # drawn last: the draws above stay
    return o

