"""tools.sweep's design check: a new sweep with a problem is refused naming it, a good one passes, --yes trains."""

from __future__ import annotations

import json

import pytest

from tools.sweep import cli
from tools.sweep.cli import main

# the CPU study's setting: N from 34k (d_model 8) to 355k (d_model 64) total parameters at 2 layers; budgets in
# measured training FLOPs (the sweep's default), the planning law the CPU study's in total N
SETTING = ["model.vocab_size=2048", "model.n_layers=2", "model.ffn.multiple_of=8"]
WIDTHS = {f"w{d}": [f"model.d_model={d}"] for d in (8, 16, 24, 32, 40, 64)}
GOOD_SIZES = dict(WIDTHS)
FAST = {"unigram": 6.2, "sims": 8}  # the unigram entropy stated (no data build), few simulated studies


def _spec(tmp_path, name="spec.yaml", **extra) -> str:
    spec = {"out": str(tmp_path / "sweep"), "set": SETTING, "ladders": {"llama": {"recipe": "recipes/llama/tiny.yaml"}},
            "check": FAST, **extra}
    path = tmp_path / name
    path.write_text(json.dumps(spec))
    return str(path)


GOOD = {"budgets": [{"flops": 3e11, "sizes": ["w8", "w16", "w24"]},
                    {"flops": 1e12, "sizes": ["w8", "w16", "w24", "w32", "w40"]},
                    {"flops": 3e12, "sizes": ["w16", "w24", "w32", "w40", "w64"]}]}


@pytest.fixture
def trained(monkeypatch):
    """run_sweep replaced by a recorder: what reached training, without training."""
    calls = []
    monkeypatch.setattr(cli, "run_sweep", lambda spec, **kw: calls.append(spec) or [])
    return calls


def test_the_first_users_sweep_is_refused_naming_each_problem(tmp_path, capsys, trained):
    """3 widths x 2 token budgets: two points near the unigram loss, no IsoFLOP group, too few points left."""
    path = _spec(tmp_path, sizes={k: WIDTHS[k] for k in ("w16", "w32", "w64")}, tokens=[2.0e5, 1.0e6])
    assert main(["--spec", path]) == 2
    out, err = capsys.readouterr()
    assert "design check found 3 problem(s)" in err and "--yes" in err
    assert "near unigram: 2 of 6 points" in out
    assert "llama-w16-tok200000" in out and "llama-w32-tok200000" in out and "llama-w64-tok200000 (" not in out
    assert "no IsoFLOP group" in out and "train at FLOPs budgets" in out
    assert "too few points: 4 usable points" in out
    assert not trained and not (tmp_path / "sweep").exists()


def test_isoflop_budgets_with_too_few_or_unbracketing_sizes_are_named(tmp_path, capsys, trained):
    bad = {"budgets": [{"flops": 3e11, "sizes": ["w16", "w24"]},  # 2 sizes
                       {"flops": 1e12, "sizes": ["w32", "w40", "w64"]},  # N_opt 1.39e5 below them
                       {"flops": 3e12, "sizes": ["w24", "w32", "w40", "w64"]}]}
    path = _spec(tmp_path, sizes={k: WIDTHS[k] for k in ("w16", "w24", "w32", "w40", "w64")}, cooldown=bad)
    assert main(["--spec", path, "--check"]) == 2
    out = capsys.readouterr().out
    assert "too few sizes: FLOPs budget 3e+11 has 2 usable size(s)" in out
    assert "not bracketed: FLOPs budget 1e+12: the predicted optimum N_opt = 1.39e+05 lies below its sizes" in out
    assert not trained


def test_an_interval_of_a_wider_than_asked_is_named(tmp_path, capsys, trained):
    path = _spec(tmp_path, sizes=GOOD_SIZES, cooldown=GOOD, check={**FAST, "max_a_width": 0.05})
    assert main(["--spec", path, "--check"]) == 2
    out = capsys.readouterr().out
    assert "a too wide: the expected 95% interval of a by approach 3 is" in out and "wider than 0.05" in out


def test_a_good_sweep_passes_and_trains(tmp_path, capsys, trained):
    path = _spec(tmp_path, sizes=GOOD_SIZES, cooldown=GOOD)
    assert main(["--spec", path, "--check"]) == 0
    out = capsys.readouterr().out
    assert "llama: 13 scaling points, no problem found" in out
    assert "expected 95% interval width of a: approach 3 a" in out and "planned: 19 runs" in out
    assert not trained  # --check trains nothing
    assert main(["--spec", path]) == 0 and len(trained) == 1


def test_yes_trains_a_refused_sweep_and_a_started_sweep_resumes_unasked(tmp_path, capsys, trained):
    path = _spec(tmp_path, sizes={"w16": WIDTHS["w16"]}, tokens=[2.0e5])
    assert main(["--spec", path]) == 2 and not trained
    assert main(["--spec", path, "--yes"]) == 0 and len(trained) == 1
    assert "--yes given, training anyway" in capsys.readouterr().out
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "manifest.json").write_text(json.dumps({"kind": "archlab-sweep", "points": []}))
    assert main(["--spec", path]) == 0 and len(trained) == 2
    assert "design check: skipped" in capsys.readouterr().out


def test_the_unigram_entropy_is_measured_on_the_training_data(tmp_path, capsys, trained):
    from archlab.config import load_recipe
    from archlab.data import prepare_data, unigram_entropy

    tiny = ["model.vocab_size=384", "data.max_bytes=150000", f"data.cache_dir={tmp_path / 'cache'}"]
    path = _spec(tmp_path, set=tiny + ["model.n_layers=1"], sizes={"w16": WIDTHS["w16"]}, tokens=[1.0e4],
                 check={"sims": 2})
    assert main(["--spec", path, "--check"]) == 2
    h = unigram_entropy(prepare_data(load_recipe("recipes/llama/tiny.yaml", tiny)).train)
    out = capsys.readouterr().out
    assert f"unigram entropy {h:.3f} (measured on the training split)" in out
    assert "near unigram: 1 of 1 points" in out


@pytest.mark.parametrize("check,message", [
    ({"law": {"alpha": -1}}, "check.law.alpha=-1: must lie in (0, inf)"),
    ({"sims": 0}, "check.sims=0: must lie in [1, inf)"),
    ({"unigrm": 6}, "check: unknown key(s) ['unigrm']"),
])
def test_bad_check_settings_fail_clearly(tmp_path, capsys, trained, check, message):
    path = _spec(tmp_path, sizes=GOOD_SIZES, cooldown=GOOD, check=check)
    assert main(["--spec", path]) == 2
    assert message in capsys.readouterr().err and not trained


def test_check_trains_nothing_and_refuses_other_modes(tmp_path, capsys):
    path = _spec(tmp_path, sizes=GOOD_SIZES, cooldown=GOOD)
    assert main(["--spec", path, "--check", "--dry-run"]) == 2
    assert "--check prints the design check and trains nothing" in capsys.readouterr().err
