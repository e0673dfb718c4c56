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
from archlab.costs import kv_cache_bytes, param_counts, training_flops, training_flops_per_token, training_memory
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


FAMILIES = [f"recipes/{name}/tiny.yaml" for name in ("llama", "mixtral", "deepseek", "mistral", "t5", "bert")]


def _figures(monkeypatch) -> list:
    figures: list = []
    monkeypatch.setattr(cli, "save_figure", lambda fig, path: figures.append(fig) or path)
    return figures


def _stacks(ax) -> dict[str, list[float]]:
    """A stacked-bar panel's series: legend label -> bar heights."""
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}


def test_flops_charts_draw_every_component_so_shares_sum_to_100(monkeypatch):
    """T5's cross-attention and BERT's MLM head transform are drawn and named: each recipe's plotted shares
    sum to 100% and every non-zero component of the cost model's breakdown has its own series."""
    figures = _figures(monkeypatch)
    rows = [cli.recipe_costs(Path(p), None, None, "bf16", 0, 1, "cuda") for p in FAMILIES]
    cli.plot_flops(rows, "f.png")
    _, share = figures[0].axes
    series = _stacks(share)
    for i, row in enumerate(rows):
        assert sum(values[i] for values in series.values()) == pytest.approx(100, abs=0.01), row["recipe"]
        components = training_flops(archlab.load_recipe(FAMILIES[i]), row["seq_len"]).components()
        for key, flops in components.items():
            if flops:
                label = cli.FLOPS_LABELS[key]
                assert series[label][i] == pytest.approx(100 * flops / row["train_flops_per_token"]), (row, key)
    legend = {text.get_text() for text in share.get_legend().get_texts()}
    assert {cli.FLOPS_LABELS["cross_attention"], cli.FLOPS_LABELS["head_transform"]} <= legend
    assert set(cli.FLOPS_LABELS) == set(components)  # every field of FlopsBreakdown has a label (csv columns)
    shares = cli.flops_shares(rows)
    assert all(sum(v[i] for v in shares.values()) == pytest.approx(100) for i in range(len(rows)))


@pytest.mark.parametrize("recipe", ["recipes/t5/tiny.yaml", "recipes/bert/tiny.yaml"])
@pytest.mark.parametrize("checkpointing", ["none", "selective"])
def test_activation_panel_is_the_memory_panels_activations(recipe, checkpointing, monkeypatch):
    """The activation panel draws every part of the cost model's activations (T5: both stacks, the
    cross-attention, the encoder output; BERT: the embedding norm, the head transform) in the memory panel's
    unit, so each of its bars is as tall as the activations part of the memory panel's bar."""
    figures = _figures(monkeypatch)
    rows = [cli.recipe_costs(Path(p), None, None, "bf16", 0, 1, "cuda", checkpointing)
            for p in ("recipes/llama/tiny.yaml", recipe)]
    cli.plot_memory(rows, "m.png", "bf16", 0, 1)
    memory, acts = figures[0].axes[:2]
    assert memory.get_ylabel() == "memory per rank (MiB)" and acts.get_ylabel() == "activation memory (MiB)"
    kept = _stacks(memory)[cli.MEMORY_LABELS["activations"]]
    drawn = [sum(values[i] for values in _stacks(acts).values()) for i in range(2)]
    assert drawn == pytest.approx(kept, rel=1e-9)
    r = archlab.load_recipe(recipe)
    want = training_memory(r, r.train.micro_batch_size, r.train.seq_len, checkpointing=checkpointing)["activations"]
    assert kept[1] == pytest.approx(want / 2**20) and want > 10 * 2**20
    parts = cli.activation_parts(rows)
    assert sum(v[1] for v in parts.values()) == pytest.approx(want)
    if "t5" in recipe:
        assert parts[cli.ACTIVATION_LABELS["cross_attention"]][1] > 0 and parts["self-attention"][1] > 0


def test_sliding_window_memory_says_why_it_exceeds_full_attention(monkeypatch, capsys):
    """mistral-tiny keeps more activations than llama-tiny (the same block, full attention) on CUDA: its
    banded blocks take a mask, and with grouped K/V heads neither flash nor memory-efficient attention runs
    them, so the math kernel's fp32 copies and probabilities are kept. The table marks the cell and says so,
    the chart marks the bar and writes the note under it; llama-tiny has no note."""
    paths = ["recipes/llama/tiny.yaml", "recipes/mistral/tiny.yaml"]
    rows = [cli.recipe_costs(Path(p), None, None, "bf16", 0, 1, "cuda") for p in paths]
    assert rows[1]["train_memory_bytes"] > rows[0]["train_memory_bytes"]
    assert rows[0]["memory_notes"] == [] and len(rows[1]["memory_notes"]) == 1
    note = rows[1]["memory_notes"][0]
    assert "math kernel" in note and "4 query / 2 KV heads" in note and "33.4 MiB" in note and "8.38 MiB" in note
    assert rows[1]["activation_breakdown"]["attention"] == pytest.approx(33.375 * 2**20)
    rc, out, _ = _run(paths, capsys)
    lines = out.splitlines()
    assert rc == 0 and lines[3].startswith("mistral-tiny") and lines[3].endswith("MiB [a]")
    assert not lines[2].endswith("]") and f"[a] mistral-tiny: train mem/rank: {note}" in lines
    figures = _figures(monkeypatch)
    cli.plot_memory(rows, "m.png", "bf16", 0, 1, "cuda")
    ticks = [t.get_text() for t in figures[0].axes[0].get_xticklabels()]
    assert ticks[1].startswith("mistral-tiny [a]") and "[a]" not in ticks[0]
    assert any("[a] mistral-tiny" in t.get_text() and "math kernel" in t.get_text() for t in figures[0].texts)
    cpu = cli.recipe_costs(Path(paths[1]), None, None, "bf16", 0, 1, "cpu")["memory_notes"]
    assert len(cpu) == 1 and "on cpu SDPA's flash kernel" in cpu[0]
    rc, out, _ = _run(paths + ["--format", "csv"], capsys)
    assert [r["memory_notes"] for r in csv.DictReader(io.StringIO(out))] == ["", note]


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
    # the table is still printed: 9 columns not modelled (params x4, FLOPs x2, KV cache/tok, state/seq, memory)
    assert out.startswith("recipe") and out.count("not modelled [") == 9
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
