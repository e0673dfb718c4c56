"""The probe measurements (mqar, mad) and what they run (analysis.probe_training): settings checked by name, the
report table from results, and the direction the papers report, reproduced on small cases: attention solves MQAR
where a model whose state is too small to hold the pairs does not (a sliding window shorter than the distance from
a key to its query; Gated DeltaNet with a tiny state), and attention learns each MAD task above its chance."""

from __future__ import annotations

import pytest
import torch

from analysis.experiment_spec import Arm
from analysis.experiments import Context
from analysis.measurements import MEASUREMENTS
from analysis.probe_training import train_probe, wilson
from archlab.data.probes import probe_task
from archlab.errors import RecipeError

LLAMA = "recipes/llama/tiny.yaml"
ATTENTION = ["model.n_heads=2", "model.n_kv_heads=2"]  # softmax attention, 2 heads of 32
WINDOW = [*ATTENTION, "model.attention.type=sliding_window", "model.attention.window=2"]  # sees 1 position back
GDN = "recipes/gdn/tiny.yaml"
GDN_TINY = ["model.n_heads=2", "model.attention.gdn_k_heads=1", "model.attention.gdn_v_heads=1",
            "model.attention.gdn_k_head_dim=2", "model.attention.gdn_v_head_dim=2"]  # a 2 x 2 state per layer


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is fastest, and the machine is shared
    yield
    torch.set_num_threads(threads)


def run(recipe, overrides, task, steps, width=64, batch=32, lr=3e-3, test_answers=1024):
    return train_probe(recipe, overrides, task, width=width, layers=2, steps=steps, batch=batch, lr=lr, seed=0,
                       test_answers=test_answers)


# --------------------------------------------------------------------------------------------
# the direction
# --------------------------------------------------------------------------------------------

SMALL_MQAR = {"vocab_size": 256, "seq_len": 64, "kv_pairs": 4}
STEPS_FAST, STEPS_SLOW, STEPS_MAD = 300, 2000, 500


def test_attention_recalls_where_a_one_back_window_cannot_small():
    """Fast: after a short run attention is far above a window that cannot reach the pairs."""
    task = probe_task("mqar", SMALL_MQAR)
    att = run(LLAMA, ATTENTION, task, steps=STEPS_FAST)
    win = run(LLAMA, WINDOW, task, steps=STEPS_FAST)
    assert att["answers"] >= 1000 and win["answers"] >= 1000
    assert att["accuracy"]["low"] > win["accuracy"]["high"] + 0.2, (att["accuracy"], win["accuracy"])


@pytest.mark.slow
@pytest.mark.parametrize("setting", [SMALL_MQAR])
def test_attention_solves_mqar_where_a_small_state_does_not(setting):
    task = probe_task("mqar", setting)
    att = run(LLAMA, ATTENTION, task, steps=STEPS_SLOW)
    win = run(LLAMA, WINDOW, task, steps=STEPS_SLOW)
    gdn = run(GDN, GDN_TINY, task, steps=STEPS_SLOW)
    assert att["accuracy"]["low"] > 0.9, att["accuracy"]
    assert win["accuracy"]["high"] < 0.5, win["accuracy"]
    assert gdn["accuracy"]["high"] < 0.5, gdn["accuracy"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["in_context_recall", "noisy_recall", "selective_copying"])
def test_attention_learns_each_mad_task_above_chance(name):
    task = probe_task(name)
    r = run(LLAMA, ATTENTION, task, steps=STEPS_MAD)
    assert r["chance"] == task.chance
    assert r["accuracy"]["low"] > 2 * task.chance, (r["accuracy"], task.chance)


# --------------------------------------------------------------------------------------------
# settings and the report
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,settings", [
    ("mqar", {}), ("mqar", {"seq_lens": [64, 128], "kv_pairs": [4, 8], "vocab_size": 512, "widths": [32, 64],
                            "steps": 100, "lr": 1.0e-3, "arms": ["a"], "seeds": [0, 1]}),
    ("mad", {"tasks": ["in_context_recall", "selective_copying"]}),
    ("mad", {"tasks": {"noisy_recall": {"frac_noise": 0.4}}, "layers": 2, "batch": 16, "test_answers": 2000}),
])
def test_valid_settings_pass_unchanged(name, settings):
    assert MEASUREMENTS[name].check(settings, f"measurements.{name}") == settings


@pytest.mark.parametrize("name,settings,message", [
    ("mqar", {"seq_lens": [64, 128], "kv_pairs": [4]}, "measurements.mqar.kv_pairs=[4]: expected one per sequence"),
    ("mqar", {"seq_len": [64]}, "measurements.mqar: unknown keys ['seq_len']; valid: arms, widths"),
    ("mqar", {"seq_lens": [30], "kv_pairs": [8]}, "probe mqar: seq_len=30: expected an even length"),
    ("mqar", {"lr": 0}, "measurements.mqar.lr=0: expected a learning rate > 0"),
    ("mad", {"tasks": ["recall"]}, "probe 'recall': unknown; valid: in_context_recall"),
    ("mad", {"tasks": "in_context_recall"}, "measurements.mad.tasks='in_context_recall': expected a list of task"),
    ("mad", {"tasks": {"noisy_recall": {"noise": 3}}}, "probe noisy_recall: unknown settings ['noise']"),
    ("mad", {"widths": [0]}, "measurements.mad.widths=[0]: expected a list of integers >= 1"),
])
def test_bad_settings_fail_naming_the_key(name, settings, message):
    with pytest.raises(RecipeError) as e:
        MEASUREMENTS[name].check(settings, f"measurements.{name}")
    assert message in str(e.value)


def test_section_pools_seeds_into_one_wilson_interval(tmp_path):
    def result(correct, answers):
        return {"correct": correct, "answers": answers, "chance": 1 / 128, "final_loss": 1.0, "cpu_s": 10.0,
                "steps": 100, "accuracy": wilson(correct, answers)}
    results = [{"arm": "att", "task": "mqar", "setting": "S=64 K=4", "width": 64, "seed": s, "result": result(c, 1024)}
               for s, c in ((0, 1000), (1, 1010))]
    results.append({"arm": "swa", "task": "mqar", "setting": "S=64 K=4", "width": 64, "seed": 0,
                    "result": result(30, 1024)})
    arms = {n: Arm(name=n, label=label, recipe=LLAMA, overrides=[], own=[])
            for n, label in (("att", "attention"), ("swa", "window 2"))}
    ctx = Context(record={}, arms=arms, rows=[], groups={}, measures={"mqar": results}, out=tmp_path)
    section = MEASUREMENTS["mqar"].section(ctx)
    att, swa = section.data["probes"]
    assert att["answers"] == 2048 and att["accuracy"] == wilson(2010, 2048) and att["seeds"] == [0, 1]
    assert swa["accuracy"]["high"] < 0.05 < att["accuracy"]["low"]
    row = "| attention (`att`) | mqar | S=64 K=4 | 64 | 0.981 [0.975, 0.986] | 0.00781 | 2048 | 10 |"
    assert row in section.markdown


def test_a_probe_refuses_a_model_that_is_not_a_causal_decoder():
    with pytest.raises(ValueError, match="model.type='encoder': a probe scores next-token answers"):
        run("recipes/bert/tiny.yaml", [], probe_task("mqar"), steps=1)
