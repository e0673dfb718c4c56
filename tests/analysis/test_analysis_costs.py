"""python -m analysis.costs: the comparison table, its formats, the charts, and its errors."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import archlab
from analysis import costs as cli
from archlab.costs import kv_cache_bytes, param_counts, training_flops_per_token, training_memory
from archlab.costs.plan import read_launch, training_plan

TINY = ["recipes/dense/tiny.yaml", "recipes/llama/tiny.yaml", "recipes/mixtral/tiny.yaml", "recipes/deepseek/tiny.yaml"]


def _run(args, capsys) -> tuple[int, str, str]:
    rc = cli.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_help_runs_as_a_module(root):
    res = subprocess.run([sys.executable, "-m", "analysis.costs", "--help"], cwd=root, capture_output=True, text=True)
    assert res.returncode == 0
    assert "--seq-len" in res.stdout and "--format" in res.stdout and "--out" in res.stdout


def test_json_numbers_are_the_cost_model(capsys):
    rc, out, _ = _run(TINY + ["--seq-len", "512", "--format", "json"], capsys)
    assert rc == 0
    rows = json.loads(out)
    assert [r["recipe"] for r in rows] == ["dense-tiny", "llama-tiny", "mixtral-tiny", "deepseek-tiny"]
    for path, row in zip(TINY, rows):
        recipe = archlab.load_recipe(path)
        counts = param_counts(recipe)
        assert row["params_total"] == archlab.num_params(recipe) == counts.total
        assert row["params_active"] == counts.active
        assert row["train_flops_per_token"] == training_flops_per_token(recipe, 512)
        assert row["kv_cache_bytes_per_token"] == kv_cache_bytes(recipe, 1, 1, "bf16")
        mem = training_memory(recipe, recipe.train.micro_batch_size, 512)
        assert row["train_memory_bytes"] == mem["total"]
        assert sum(row["flops_breakdown"].values()) == pytest.approx(row["train_flops_per_token"])
    assert rows[2]["params_active"] < rows[2]["params_total"]  # MoE


def test_table_and_csv(capsys):
    rc, out, _ = _run(TINY[:2] + ["--seq-len", "1024"], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert "train FLOP/tok" in lines[0] and "KV cache/tok" in lines[0]
    assert lines[2].startswith("dense-tiny") and lines[3].startswith("llama-tiny")
    assert "MFLOP" in lines[2] and lines[0].split()[1] == "seq_len" and lines[2].split()[1] == "1024"
    rc, out, _ = _run(TINY[:2] + ["--format", "csv", "--batch", "2"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["recipe"] for r in rows] == ["dense-tiny", "llama-tiny"]
    assert rows[0]["batch"] == "2" and rows[0]["seq_len"] == "128"  # the recipe's train.seq_len
    assert float(rows[1]["train_flops_per_token"]) == training_flops_per_token(archlab.load_recipe(TINY[1]), 128)


def test_zero_and_expert_parallel_shard_the_states(capsys):
    rc, out, _ = _run(["recipes/mixtral/tiny.yaml", "recipes/dense/tiny.yaml", "--format", "json"], capsys)
    single = json.loads(out)
    rc, out, _ = _run(["recipes/mixtral/tiny.yaml", "recipes/dense/tiny.yaml", "--format", "json",
                       "--zero-stage", "3", "--dp", "4", "--ep", "2"], capsys)
    assert rc == 0
    sharded = json.loads(out)
    for a, b in zip(single, sharded):
        for part in ("weights", "grads", "optimizer"):
            assert b["memory_breakdown"][part] == pytest.approx(a["memory_breakdown"][part] / 4)


def test_folder_stands_for_its_recipes(capsys):
    rc, out, _ = _run(["recipes/mixtral", "--format", "json"], capsys)
    assert rc == 0
    names = {r["recipe"] for r in json.loads(out)}
    assert names == {archlab.load_recipe(p).name for p in Path("recipes/mixtral").glob("*.yaml")}  # every file once
    assert {"mixtral-tiny", "mixtral-mini", "mixtral-xs", "mixtral-s"} <= names


def test_folders_are_searched_recursively_and_launch_configs_skipped_with_a_note(capsys):
    rc, out, err = _run(["recipes", "--format", "json"], capsys)
    assert rc == 0
    names = {r["recipe"] for r in json.loads(out)}
    assert {"llama-tiny", "mixtral-s", "dense-tiny"} <= names and len(names) == len(MODEL_RECIPES)
    assert "skipped recipes/launch/ddp.yaml: an accelerate launch config" in err
    rc, out, _ = _run(["recipes/llama/tiny.yaml", "recipes/llama/125m.yaml"], capsys)  # each row's own seq_len
    seq = {line.split()[0]: line.split()[1] for line in out.splitlines()[2:4]}
    lens = {archlab.load_recipe(f"recipes/llama/{n}.yaml").name: archlab.load_recipe(f"recipes/llama/{n}.yaml")
            for n in ("tiny", "125m")}
    assert seq == {name: str(r.train.seq_len) for name, r in lens.items()} and len(set(seq.values())) == 2


def test_out_writes_the_charts_and_the_table(tmp_path, capsys):
    rc, _, err = _run(TINY + ["--out", str(tmp_path), "--format", "csv", "--checkpointing"], capsys)
    assert rc == 0
    for name in ("flops_breakdown.png", "memory_breakdown.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert (tmp_path / "costs.csv").read_text().startswith("recipe,")
    assert not list(tmp_path.glob("*.tmp*"))
    assert "wrote" in err


def test_every_chart_has_title_units_and_legend(monkeypatch, capsys):
    figures = []
    monkeypatch.setattr(cli, "save_figure", lambda fig, path: figures.append(fig) or path)
    rows = [cli.recipe_costs(Path(p), 256, 4, "bf16", 0, 1, "cuda", False) for p in TINY]
    cli.plot_flops(rows, "f.png")
    cli.plot_memory(rows, "m.png", "bf16", 0, 1)
    assert len(figures) == 2
    for fig in figures:
        for ax in fig.axes:
            assert ax.get_title() and ax.get_xlabel()
            assert "(" in ax.get_ylabel()  # the unit
            bars = {p.get_height() for p in ax.patches}
            assert bars and max(bars) > 0
        assert any(ax.get_legend() is not None for ax in fig.axes)


@pytest.mark.parametrize("args, message", [
    (["does/not/exist.yaml"], "no such recipe"),
    (["recipes/launch/ddp.yaml"], "no recipe left"),
    (["recipes/dense/tiny.yaml", "--seq-len", "4096"], "max_seq_len"),
    (["recipes/mixtral/tiny.yaml", "--dp", "4", "--ep", "3"], "ep=3"),
])
def test_bad_input_fails_with_a_clear_message(args, message, capsys):
    rc, out, err = _run(args, capsys)
    assert rc == 2
    assert message in err and "Traceback" not in err
    assert out == ""


def test_empty_folder_and_bad_numbers(tmp_path, capsys):
    rc, _, err = _run([str(tmp_path)], capsys)
    assert rc == 2 and "no recipe" in err
    (tmp_path / "notes.yaml").write_text("- just\n- a list\n")
    rc, _, err = _run([str(tmp_path / "notes.yaml")], capsys)
    assert rc == 2 and "mapping" in err
    for bad in (["--seq-len", "0"], ["--seq-len", "ten"], ["--format", "xml"], ["--dp", "-1"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["recipes/dense/tiny.yaml", *bad])
        assert e.value.code == 2


MODEL_RECIPES = sorted(str(p.relative_to(Path(__file__).resolve().parents[2]))
                       for p in (Path(__file__).resolve().parents[2] / "recipes").glob("*/*.yaml")
                       if p.parent.name != "launch")


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("checkpointing", ["none", "full", "selective"])
def test_every_recipe_gives_a_full_table_on_both_devices(device, checkpointing, capsys):
    """No cell of any recipe in recipes/ is left "not modelled", on the CPU or on CUDA (where the
    banded sliding-window path's bytes are derived, not measured), in every checkpointing mode."""
    rc, out, err = _run([*MODEL_RECIPES, "--device", device, "--checkpointing", checkpointing, "--format", "json"],
                        capsys)
    assert rc == 0 and err == ""
    rows = json.loads(out)
    assert len(rows) == len(MODEL_RECIPES) > 20
    for row in rows:
        assert row["not_modelled"] == {}, row["recipe"]
        assert all(row[k] is not None for k in cli.COLUMNS), row["recipe"]
        assert row["train_memory_bytes"] > 0
    rc, out, _ = _run([*MODEL_RECIPES, "--device", device, "--checkpointing", checkpointing], capsys)
    assert rc == 0 and "not modelled" not in out


def _no_sliding_memory(monkeypatch):
    """A component that cannot model the activation memory of these settings (raises, never guesses)."""
    from archlab.nn.attention.sliding import SlidingWindowAttention

    def refuse(cls, s, *, layer, kernel=None):
        raise NotImplementedError(f"sliding_window: no model on {s.device} (test)")

    monkeypatch.setattr(SlidingWindowAttention, "saved_bytes", classmethod(refuse))


def test_a_cell_not_modelled_keeps_every_other_cell_and_recipe(monkeypatch, tmp_path, capsys):
    _no_sliding_memory(monkeypatch)
    recipes = TINY[:2] + ["recipes/mistral/tiny.yaml"]
    rc, out, err = _run(recipes + ["--out", str(tmp_path)], capsys)
    assert rc == 0
    lines = out.splitlines()
    mistral = next(line for line in lines if line.startswith("mistral-tiny"))
    assert mistral.rstrip().endswith("not modelled [1]") and "MFLOP" in mistral and "768 B" in mistral
    assert all("not modelled" not in line for line in lines if line.startswith(("dense-tiny", "llama-tiny")))
    assert ("[1] mistral-tiny: train mem/rank not modelled: no activation-memory model for --device cuda: "
            "sliding_window: no model on cuda (test)") in lines
    # the charts leave the recipe out where its numbers are missing, and say so
    assert (tmp_path / "flops_breakdown.png").is_file() and (tmp_path / "memory_breakdown.png").is_file()
    assert "memory_breakdown.png: without mistral-tiny (not modelled)" in err
    assert "not modelled [1]" in (tmp_path / "costs.txt").read_text()

    rc, out, err = _run(recipes + ["--format", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rc == 0 and [r["recipe"] for r in rows] == ["dense-tiny", "llama-tiny", "mistral-tiny"]
    assert rows[2]["train_memory_bytes"] == "" and rows[2]["memory_activations"] == ""
    assert float(rows[2]["train_flops_per_token"]) > 0 and rows[0]["not_modelled"] == ""
    assert rows[2]["not_modelled"].startswith("train_memory_bytes: no activation-memory model for --device cuda")
    assert "note: [1] mistral-tiny: train mem/rank not modelled" in err

    rc, out, _ = _run(recipes + ["--format", "json", "--device", "cpu"], capsys)
    rows = json.loads(out)
    assert rc == 0 and rows[2]["train_memory_bytes"] is None and rows[2]["activation_breakdown"] is None
    assert rows[2]["params_total"] == rows[1]["params_total"]  # same LLaMA block, other attention
    assert set(rows[2]["not_modelled"]) == {"train_memory_bytes", "memory_breakdown", "activation_breakdown"}
    assert "--device cpu: sliding_window: no model on cpu (test)" in rows[2]["not_modelled"]["train_memory_bytes"]
    assert rows[0]["not_modelled"] == {} and rows[0]["train_memory_bytes"] > 0


def test_one_footnote_per_reason_and_nothing_computed_exits_1(monkeypatch, capsys):
    _no_sliding_memory(monkeypatch)
    rc, out, _ = _run(["recipes/mistral/tiny.yaml", "recipes/mistral/tiny.yaml"], capsys)
    assert rc == 0 and out.count("not modelled [1]") == 2 and "[2]" not in out
    assert "[1] mistral-tiny, mistral-tiny: train mem/rank not modelled" in out

    def refuse(*args, **kwargs):
        raise NotImplementedError("nothing here (test)")

    for name in ("param_counts", "forward_flops", "kv_cache_bytes", "training_memory"):
        monkeypatch.setattr(cli, name, refuse)
    rc, out, err = _run(["recipes/dense/tiny.yaml"], capsys)
    assert rc == 1 and "nothing could be computed" in err
    assert out.startswith("recipe") and out.count("not modelled [") == 8  # the table is still printed
    assert "[1] dense-tiny: params, embedding, non-emb., active not modelled: no params model: nothing here" in out


def test_plan_prints_memory_fit_throughput_and_hours(capsys):
    """``plan``: the numbers of archlab.costs.plan for the launch; the table names every part and the verdict."""
    rc, out, err = _run(["plan", "recipes/dense/125m.yaml", "--gpus", "8", "--gpu", "h200", "--mfu", "30%",
                         "--format", "json"], capsys)
    assert rc == 0 and err == ""
    want = training_plan(archlab.load_recipe("recipes/dense/125m.yaml"), read_launch(None, 8), gpu="h200", mfu=0.3)
    assert json.loads(out) == json.loads(json.dumps(want.as_dict()))
    assert json.loads(out)["launch"].startswith("8 GPUs, DDP")
    rc, out, _ = _run(["plan", "recipes/dense/125m.yaml", "--launch", "recipes/launch/zero2.yaml", "--gpus", "8"],
                      capsys)
    assert rc == 0
    assert "8 GPUs, DeepSpeed ZeRO-2 (recipes/launch/zero2.yaml), H100 SXM 80GB, deepspeed bf16" in out
    for part in ("weights", "gradients", "optimizer state", "activations (1 micro-batch)", "peak per GPU",
                 "(fits:", "tokens/s", "GPU-hours"):
        assert part in out, part


def test_plan_takes_recipe_overrides(capsys):
    """KEY=VALUE overrides reach the plan as they reach the trainer: expert parallelism shards the experts'
    weights; an unknown key is refused by name."""
    base = ["plan", "recipes/mixtral/s.yaml", "--launch", "recipes/launch/zero2.yaml", "--gpus", "8", "--format",
            "json"]
    rc, out, _ = _run(base, capsys)
    rc_ep, out_ep, _ = _run([*base[:2], "model.moe.ep_size=8", *base[2:]], capsys)
    assert rc == rc_ep == 0
    want = training_plan(archlab.load_recipe("recipes/mixtral/s.yaml", ["model.moe.ep_size=8"]),
                         read_launch(Path("recipes/launch/zero2.yaml"), 8))
    assert json.loads(out_ep) == json.loads(json.dumps(want.as_dict())) != json.loads(out)
    rc, out, err = _run(["plan", "recipes/mixtral/s.yaml", "model.moe.ep_sise=8"], capsys)
    assert rc == 2 and "model.moe.ep_sise" in err and "did you mean model.moe.ep_size" in err


def test_plan_runs_as_a_module_beside_the_table(root):
    res = subprocess.run([sys.executable, "-m", "analysis.costs", "plan", "recipes/llama/125m.yaml", "--launch",
                          "recipes/launch/zero1.json", "--gpus", "4", "--gpu", "a100"], cwd=root,
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "4 GPUs, DeepSpeed ZeRO-1" in res.stdout and "A100" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["does/not/exist.yaml"], "does/not/exist.yaml: no such recipe file"),
    (["recipes/launch/ddp.yaml"], "an accelerate launch config, not a recipe; pass it as --launch"),
    (["recipes/dense/125m.yaml", "--launch", "recipes/dense/tiny.yaml"], "not an accelerate config"),
    (["recipes/dense/125m.yaml", "--launch", "no/such.yaml"], "no/such.yaml: no such launch config"),
])
def test_plan_refuses_bad_input_in_one_line(args, message, capsys):
    rc, out, err = _run(["plan", *args], capsys)
    assert rc == 2 and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("bad", [["--gpu", "v100"], ["--mfu", "0"], ["--mfu", "150%"], ["--gpus", "0"]])
def test_plan_refuses_bad_numbers(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["plan", "recipes/dense/125m.yaml", *bad])
    assert e.value.code == 2
    assert bad[1] in capsys.readouterr().err
