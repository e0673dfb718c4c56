"""The console: the block at start, the data build's progress lines, the bar's fields, the closing lines,
``--help``'s key groups and ``--print-config``."""

import json
import re

import pytest
from omegaconf import OmegaConf

import archlab
from archlab.config.keys import key_groups
from archlab.costs.plan import Launch, memory_plan
from archlab.train import train
from archlab.train.console import BarFields, closing_lines, duration, routing_fields


def _lines(err: str) -> str:
    return err.replace("\r", "\n")


def test_start_block_states_what_runs_with_the_models_own_numbers(tiny_cfg, capsys):
    cfg = tiny_cfg("train.max_steps=4", "train.eval_every=2")
    model_params = sum(p.numel() for p in archlab.build_model(cfg).parameters())
    summary = train(cfg, "recipes/llama/tiny.yaml + train.max_steps=4")
    err = _lines(capsys.readouterr().err)
    assert "recipe recipes/llama/tiny.yaml + train.max_steps=4 (llama-tiny)" in err
    total, active, embedding = map(lambda s: int(s.replace(",", "")), re.search(
        r"parameters ([\d,]+) total, ([\d,]+) active, ([\d,]+) embedding", err).groups())
    assert total == model_params == active  # a dense model: every parameter is active
    assert embedding == cfg.model.vocab_size * cfg.model.d_model  # RoPE: the token table only
    env = json.loads(open(f"{summary['run_dir']}/env.json").read())
    fpt = float(re.search(r"FLOPs per token ([\d.]+) k", err).group(1)) * 1e3
    assert fpt == pytest.approx(env["flops_per_token"], rel=5e-3)
    assert f"tokens per step {4 * 32:,} (4 x 1 accumulation x 1 process x 32 tokens)" in err
    assert "backend plain on cpu, precision fp32 (train.precision=auto)" in err
    # the plan's memory for this run (one process, fp32, CPU kernels): weights are the model's fp32 bytes
    plan = memory_plan(cfg, Launch(), precision="fp32", device="cpu")
    assert f"memory plan: {plan.summary('process')}" in err
    peak, weights, grads, optimizer = map(float, re.search(
        r"memory plan: ([\d.]+) MiB per process at peak \(fp32; MiB: weights ([\d.]+), grads ([\d.]+), "
        r"optimizer ([\d.]+), activations", err).groups())
    assert weights == grads == pytest.approx(4 * model_params / 2**20, rel=1e-3) and optimizer == pytest.approx(
        2 * weights, rel=1e-3)
    assert peak > weights + optimizer
    assert f"run folder {summary['run_dir']}" in err
    assert "warmup:" not in err  # the tiny overrides' 2 warmup steps fit
    # the bar: loss, lr, tokens/s, MFU and, after the evaluation at step 2, the validation loss
    bar = [line for line in err.splitlines() if "4/4" in line][-1]
    assert all(f"{field}=" in bar for field in ("loss", "lr", "tok/s", "mfu", "val")), bar


def test_data_build_says_what_it_builds_and_a_capped_warmup_is_recorded(tiny_overrides, tmp_path, root, capsys):
    """A recipe's 30-step warmup under train.max_steps=5: capped to 10% (1 step), printed, saved with the run."""
    overrides = [o for o in tiny_overrides if not o.startswith("train.warmup_steps")]
    cfg = archlab.load_recipe(root / "recipes/llama/tiny.yaml", [
        *overrides, "train.max_steps=5", f"data.cache_dir={tmp_path / 'cache'}", f"train.out_dir={tmp_path}",
        "train.run_name=run"])
    summary = train(cfg)
    err = _lines(capsys.readouterr().err)
    assert "data: building the token cache" in err
    assert f"data: training the bpe tokenizer ({cfg.model.vocab_size:,} ids)" in err
    assert "data: encoding the training and validation splits" in err
    assert "warmup: train.warmup_steps=30 exceeds train.max_steps=5: capped to 1 (10% of the steps" in err
    saved = OmegaConf.load(f"{summary['run_dir']}/recipe.yaml")
    assert (saved.train.warmup_steps, saved.train.warmup_capped_from) == (1, 30)
    assert json.loads(open(f"{summary['run_dir']}/env.json").read())["warmup_capped_from"] == 30
    again = cfg.copy()
    again.train.run_name = "again"
    train(again)  # the cache now exists: loaded without building
    assert "data: building" not in capsys.readouterr().err


def test_bar_fields_and_the_objectives_validation_loss():
    row = {"loss": 3.14159, "lr": 1.5e-3, "tokens_per_s": 12345.6, "mfu": 0.0123}
    fields = BarFields()
    assert fields.postfix(row) == {"loss": "3.142", "lr": "1.50e-03", "tok/s": "12,346", "mfu": "1.23%"}
    fields.saw({"kind": "val", "context_multiplier": 2, "loss": 9.0})  # a longer context: not the bar's
    assert "val" not in fields.postfix(row)
    fields.saw({"kind": "val", "context_multiplier": 1, "loss": 4.5})
    assert fields.postfix(row)["val"] == "4.500"
    mlm = BarFields("mlm_loss")
    mlm.saw({"kind": "val", "context_multiplier": 1, "mlm_loss": 2.25})
    assert mlm.postfix(row)["val"] == "2.250"


def _routing_health(row: dict) -> tuple[float, float]:
    """MaxVio p90 over the layers and the dropped fraction, recomputed from the row's per-layer counts."""
    layers = sorted({k.split("/")[1] for k in row if k.startswith("moe/layer")})
    maxvio = []
    for name in layers:
        counts = row[f"moe/{name}/tokens_per_expert"]
        mean = sum(counts) / len(counts)
        maxvio.append((max(counts) - mean) / mean)
    v, pos = sorted(maxvio), 0.9 * (len(maxvio) - 1)  # linear interpolation between order statistics
    lo = int(pos)
    p90 = v[lo] + (pos - lo) * (v[min(lo + 1, len(v) - 1)] - v[lo])
    dropped = sum(row[f"moe/{n}/dropped_slots"] for n in layers)
    slots = sum(row[f"moe/{n}/tokens"] * row[f"moe/{n}/top_k"] for n in layers)
    return p90, dropped / slots


def test_bar_shows_routing_health_of_an_moe_row_and_nothing_for_a_dense_one():
    dense = {"loss": 3.0, "lr": 1e-3, "tokens_per_s": 100.0, "mfu": 0.01, "aux_loss": 0.0}
    assert routing_fields(dense) == {} and set(BarFields().postfix(dense)) == {"loss", "lr", "tok/s", "mfu"}
    moe = {**dense, "aux_loss": 0.0213, "moe/maxvio_p90": 0.82}
    for i, (counts, dropped) in enumerate((([30, 10, 10, 14], 0), ([40, 4, 8, 12], 16))):  # 40 tokens, top-2
        moe.update({f"moe/layer{i}/tokens_per_expert": counts, f"moe/layer{i}/tokens": 40.0,
                    f"moe/layer{i}/top_k": 2, f"moe/layer{i}/dropped_slots": float(dropped)})
    moe["moe/maxvio_p90"] = _routing_health(moe)[0]
    fields = BarFields().postfix(moe)
    assert fields["aux"] == "0.0213" and fields["maxvio p90"] == f"{moe['moe/maxvio_p90']:.3f}"
    assert fields["dropped"] == "10.00%"  # 16 of 2 x 40 x 2 slots
    assert routing_fields({**moe, "moe/layer1/dropped_slots": 0.0})["dropped"] == "0%"  # dropless


def test_moe_run_bar_shows_aux_maxvio_and_dropped_of_its_last_row(tiny_cfg, rows, capsys):
    """A capacity-limited Mixtral run: the bar's routing fields are the last row's, recomputed from its layers."""
    cfg = tiny_cfg("train.max_steps=4", "train.log_every=2", "train.eval_every=100", "model.moe.capacity_factor=1.0",
                   recipe="mixtral/tiny")
    summary = train(cfg)
    bar = [line for line in _lines(capsys.readouterr().err).splitlines() if "4/4" in line][-1]
    last = rows(summary["run_dir"])[-1]
    p90, dropped = _routing_health(last)
    assert dropped > 0  # capacity 1.0 drops slots, so the field is tested on a non-zero value
    assert f"aux={last['aux_loss']:.3g}," in bar and last["aux_loss"] > 0, bar
    assert f"maxvio p90={p90:.3f}," in bar, bar
    assert f"dropped={100 * dropped:.2f}%" in bar, bar


def test_closing_lines_give_wall_time_tokens_speed_and_mfu():
    summary = {"status": "completed", "step": 300, "run_dir": "runs/x", "final_val_loss": {"128": 4.5},
               "unigram_entropy_train": 6.7, "elapsed_s": 83.4, "tokens": 614400, "mean_tokens_per_s": 7400.2,
               "mean_mfu": 0.0123}
    text = closing_lines(summary)
    assert "[archlab] wall time 1m23s, 614,400 tokens, 7,400 tokens/s (training steps), MFU 1.23%" in text
    assert "4.500 at 128 tokens" in text and text.endswith("runs/x/loss.png")
    assert (duration(4000), duration(0.6)) == ("1h06m40s", "0.6s")


def test_help_lists_every_key_group(capsys):
    from archlab.train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for group in key_groups():
        if group:
            assert re.search(rf"^  {re.escape(group)}\.\* +\S", out, re.M), group
    assert "train.schedule" in out and "constant | cosine | wsd" in out and "--print-config" in out


def test_print_config_prints_the_resolved_recipe_and_trains_nothing(root, tmp_path, capsys):
    from archlab.train.__main__ import main

    recipe = str(root / "recipes/llama/tiny.yaml")
    args = [recipe, "train.max_steps=20", f"train.out_dir={tmp_path}"]
    assert main([*args, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "# train.warmup_steps=30 exceeds train.max_steps=20: capped to 2" in out
    assert OmegaConf.create(out) == archlab.load_recipe(recipe, args[1:])
    assert not any(tmp_path.iterdir())  # no run folder
    assert main([recipe, "train.max_step=20", "--print-config"]) == 2
    assert "did you mean train.max_steps" in capsys.readouterr().err
