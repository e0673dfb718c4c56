"""The KV-cache measurement and the costs the experiment runner reports: a Gated DeltaNet layer's fixed-size state
is bytes per sequence, not per token (at context 1 the whole state used to be reported as "KV bytes/token"), and
``kv_cache: {contexts}`` tabulates cache + state at multiples of the training context."""

from __future__ import annotations

import pytest

from analysis.experiments import kv_and_state
from analysis.measurements import MEASUREMENTS
from analysis.measurements.kv_cache import cache_bytes
from archlab.config import load_recipe
from archlab.costs import kv_cache_bytes
from archlab.errors import RecipeError


def _cfg(family: str):
    return load_recipe(f"recipes/{family}/tiny.yaml", [])


def test_attention_has_no_state_and_gdn_no_per_token_cache():
    llama, gdn, hybrid = _cfg("llama"), _cfg("gdn"), _cfg("hybrid")
    assert kv_and_state(llama) == (kv_cache_bytes(llama, batch=1, context=1, dtype="bf16"), 0.0)
    per_token, state = kv_and_state(gdn)
    assert per_token == 0.0 and state == kv_cache_bytes(gdn, batch=1, context=1000, dtype="bf16") > 0
    # the hybrid: one attention layer in four grows per token (2 KV heads x head dim 24 x K,V x 2 bytes), three keep
    # a state
    per_token, state = kv_and_state(hybrid)
    assert per_token == 2 * 24 * 2 * 2
    assert state == kv_cache_bytes(hybrid, batch=1, context=1, dtype="bf16") - per_token > 0


def test_cache_bytes_at_multiples_of_the_context():
    llama, gdn = _cfg("llama"), _cfg("gdn")
    seq = int(llama.train.seq_len)
    att = cache_bytes(llama, [seq, 8 * seq])
    assert [a["bytes"] for a in att["contexts"]] == [768 * seq, 768 * 8 * seq]
    assert [a["per_token"] for a in att["contexts"]] == [768, 768] and att["at_train_context"] == 768
    rec = cache_bytes(gdn, [seq, 8 * seq])
    assert rec["contexts"][0]["bytes"] == rec["contexts"][1]["bytes"] == rec["state"]
    assert rec["contexts"][1]["per_token"] == pytest.approx(rec["state"] / (8 * seq))
    assert rec["at_train_context"] == pytest.approx(rec["state"] / seq)


def test_contexts_setting_is_checked():
    m = MEASUREMENTS["kv_cache"]
    assert m.check({"contexts": [1, 2, 4, 8]}, "measurements.kv_cache") == {"contexts": [1, 2, 4, 8]}
    assert m.check({}, "measurements.kv_cache") == {}
    with pytest.raises(RecipeError, match=r"measurements.kv_cache.contexts=\[0, 2\]"):
        m.check({"contexts": [0, 2]}, "measurements.kv_cache")
    with pytest.raises(RecipeError, match=r"unknown keys \['context'\]"):
        m.check({"context": [1]}, "measurements.kv_cache")


def test_the_report_costs_of_the_hybrid_spec_split_cache_and_state():
    """``arm_costs`` (the report's cost columns, ``plan``'s arm lines): per-token KV cache and state per sequence."""
    from analysis.experiments import arm_costs
    from tools.experiment import load_spec, resolve_arms

    costs = {a.name: arm_costs(a) for a in resolve_arms(load_spec("experiments/hybrid.yaml"))}
    assert costs["attention"]["state_bytes_per_sequence"] == 0 < costs["attention"]["kv_bytes_per_token"]
    assert costs["gdn"]["kv_bytes_per_token"] == 0 < costs["gdn"]["state_bytes_per_sequence"]
    assert costs["hybrid"]["kv_bytes_per_token"] == costs["attention"]["kv_bytes_per_token"] / 4
    assert 0 < costs["hybrid"]["state_bytes_per_sequence"] < costs["gdn"]["state_bytes_per_sequence"]
