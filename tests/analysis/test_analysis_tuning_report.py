"""The tuning figure: every arm's grid as one line that the legend tells apart."""
from types import SimpleNamespace

from analysis import tuning_report
from analysis.plotting import COLORS, pyplot


def test_arms_past_the_palette_differ_by_marker_and_line_style(tmp_path, monkeypatch):
    n = len(COLORS) + 3
    arms = {f"a{i}": SimpleNamespace(label=f"arm {i}") for i in range(n)}
    tuning = {name: {"lrs": [1e-3, 2e-3, 4e-3], "losses": [4.0 + i / 100, 3.9, 4.1], "diverged": [False] * 3,
                     "lr": 2e-3, "grid_lr": 2e-3, "loss": 3.9} for i, name in enumerate(arms)}
    figures = []
    monkeypatch.setattr(tuning_report, "save_figure", lambda fig, path: figures.append(fig) or path)
    ctx = SimpleNamespace(arms=arms, spec=SimpleNamespace(name="t"))
    assert tuning_report.plot(ctx, tuning, tmp_path / "tuning.png") == tmp_path / "tuning.png"
    lines = [ln for ln in figures[0].axes[0].get_lines() if ln.get_label().startswith("arm ")]
    looks = [(ln.get_color(), ln.get_marker(), ln.get_linestyle()) for ln in lines]
    assert len(lines) == n and len(set(looks)) == n  # no two arms drawn alike
    assert looks[0][1:] == ("o", "-") and looks[len(COLORS)][1:] == ("s", "--")
    pyplot().close(figures[0])


def _plot(tmp_path, monkeypatch, tuning):
    figures = []
    monkeypatch.setattr(tuning_report, "save_figure", lambda fig, path: figures.append(fig) or path)
    ctx = SimpleNamespace(arms={a: SimpleNamespace(label=a) for a in tuning}, spec=SimpleNamespace(name="t"))
    tuning_report.plot(ctx, tuning, tmp_path / "tuning.png")
    ax = figures[0].axes[0]
    stars = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
    dashed = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--" and ln.get_label().startswith("_")]
    title = ax.get_title()
    pyplot().close(figures[0])
    return stars, dashed, title


def test_the_tuning_plot_draws_the_star_and_dashed_line_its_title_names(tmp_path, monkeypatch):
    # the chosen lr on a grid point: its dashed line is drawn all the same
    learned = {"lrs": [1e-3, 2e-3, 4e-3], "losses": [4.0, 3.9, 4.1], "diverged": [False] * 3, "lr": 2e-3,
               "grid_lr": 2e-3, "loss": 3.9}
    stars, dashed, title = _plot(tmp_path, monkeypatch, {"a": learned})
    assert len(stars) == 1 and len(dashed) == 1 and list(dashed[0].get_xdata()) == [2e-3, 2e-3]
    assert "star: the grid's best run" in title and "dashed: the chosen lr" in title
    # no lr learned: no star, and the title says so instead of promising one
    none = {**learned, "did_not_learn": [True] * 3, "loss": None, "learned": False}
    stars, dashed, title = _plot(tmp_path, monkeypatch, {"a": none})
    assert not stars and len(dashed) == 1
    assert "star: the grid" not in title and "no star for a: no lr learned" in title
