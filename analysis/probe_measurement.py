"""What the probe measurements (``mqar``, ``mad``) share: their training settings, their runs (each listed arm x
task setting x width x seed trained from scratch by :func:`analysis.probe_training.train_probe`, cached under
``<out>/measurements/<name>/``) and their report section (accuracy at the answer positions with a 95% Wilson
interval over the test answers, seeds pooled, beside the task's chance).
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Optional

from analysis.experiments import Context, Section, fmt_ci, table
from analysis.measurements.base import (
    Measurement,
    cached,
    check_int,
    check_ints,
    check_names,
    measurement_folder,
    record_arms,
)
from analysis.probe_training import train_and_store, train_probe, wilson
from archlab.data.probes import ProbeTask
from archlab.errors import RecipeError

TRAIN_KEYS = ("arms", "widths", "layers", "steps", "batch", "lr", "test_answers", "seeds")
# the tiny CPU setting: a 2-layer model of width 64, 1000 steps of 32 sequences (~40 CPU s at sequence 64; attention
# learns each MAD task well above chance in 500)
TRAIN_DEFAULTS = {"widths": [64], "layers": 2, "steps": 1000, "batch": 32, "lr": 3e-3, "test_answers": 1024,
                  "seeds": [0]}


class ProbeMeasurement(Measurement):
    """A measurement that trains each listed arm on probe tasks. Subclasses name their tasks (:meth:`tasks`)."""

    keys = TRAIN_KEYS  # a subclass adds its own: keys = TRAIN_KEYS + (...)
    parallel = True  # its runs are independent: the runner trains them --jobs at a time
    defaults: dict = TRAIN_DEFAULTS  # the training settings a spec leaves out
    quick = {"steps": 20, "test_answers": 64}
    intro = ""  # the report section's first sentence: what the task is

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_names(s, "arms", where)
        check_ints(s, "widths", where)
        check_ints(s, "seeds", where, minimum=0)
        for key in ("layers", "steps", "batch", "test_answers"):
            check_int(s, key, where)
        lr = s.get("lr", 1.0)
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
            raise RecipeError(f"{where}.lr={lr!r}: expected a learning rate > 0, e.g. 3.0e-3")
        self.tasks(s, where)  # each task's settings checked by the task
        return s

    def tasks(self, settings: dict, where: str) -> list[tuple[str, ProbeTask]]:
        """(setting label, task) of every task setting the measurement trains on."""
        raise NotImplementedError

    def run(self, record: dict, log=print, jobs: int = 1) -> list[dict]:
        """Train (or read from the cache) every listed arm x task setting x width x seed, ``jobs`` at a time
        (each in its own process on one thread when ``jobs`` > 1)."""
        m = {**self.defaults, **self.settings(record)}
        arms = {a.name: a for a in record_arms(record)}
        listed = m.get("arms") or list(arms)
        folder = measurement_folder(record) / self.name
        out, todo = [], []
        for name in listed:
            if name not in arms:
                raise ValueError(f"measurements.{self.name}.arms: {name!r} is not an arm (arms: {', '.join(arms)})")
            arm = arms[name]
            for label, task in self.tasks(m, f"measurements.{self.name}"):
                for width in m["widths"]:
                    for seed in m["seeds"]:
                        train = {"width": int(width), "layers": int(m["layers"]), "steps": int(m["steps"]),
                                 "batch": int(m["batch"]), "lr": float(m["lr"]), "seed": int(seed)}
                        settings = {"recipe": arm.recipe, "overrides": list(arm.overrides), "task": task.name,
                                    "task_settings": vars(task), **train, "test_answers": int(m["test_answers"])}
                        path = folder / f"{name}-{task.name}-{label.replace(' ', '')}-w{width}-seed{seed}.json"
                        job = (path, settings, arm.recipe, list(arm.overrides), task, train, int(m["test_answers"]))
                        if not path.is_file():
                            log(f"{self.name}: {name}, {task.name} {label}, width {width}, seed {seed}")
                            todo.append(job)
                        out.append(({"arm": name, "task": task.name, "setting": label, "width": int(width),
                                     "seed": int(seed)}, job))
        if jobs > 1 and len(todo) > 1:
            with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=get_context("spawn")) as pool:
                list(pool.map(train_and_store, todo, [1] * len(todo)))  # each stores its result in its cache file
        return [{**row, "result": cached(path, settings, lambda: train_probe(recipe, overrides, task,
                                                                              test_answers=answers, **train))}
                for row, (path, settings, recipe, overrides, task, train, answers) in out]

    def section(self, ctx: Context) -> Section:
        results = ctx.measures.get(self.name) or []
        groups: dict[tuple, list[dict]] = {}
        for r in results:
            groups.setdefault((r["arm"], r["task"], r["setting"], r["width"]), []).append(r)
        rows, data = [], []
        for (arm, task, setting, width), rs in groups.items():
            correct = sum(r["result"]["correct"] for r in rs)
            answers = sum(r["result"]["answers"] for r in rs)
            d = {"arm": arm, "task": task, "setting": setting, "width": width, "seeds": [r["seed"] for r in rs],
                 "accuracy": wilson(correct, answers), "answers": answers, "chance": rs[0]["result"]["chance"],
                 "final_loss": [r["result"]["final_loss"] for r in rs],
                 "cpu_s_per_run": sum(r["result"]["cpu_s"] for r in rs) / len(rs)}
            data.append(d)
            label = ctx.arms[arm].label if arm in ctx.arms else arm
            rows.append([f"{label} (`{arm}`)", task, setting, width, fmt_ci(d["accuracy"]), f"{d['chance']:.3g}",
                         answers, f"{d['cpu_s_per_run']:.0f}"])
        first: Optional[dict] = results[0]["result"] if results else None
        md = (self.intro + " Each arm's architecture (its recipe and overrides) is trained from scratch on the "
              "task's train set at the probe's vocabulary, sequence length and width"
              + (f" ({first['steps']} steps)" if first else "") + ", then scored at the answer positions of a "
              "test set drawn from another stream of the same seed. Accuracy: share of answers right (argmax), "
              "seeds pooled, 95% Wilson interval over the answers; chance: a uniform guess over the answer ids.\n\n"
              + table(["arm", "task", "setting", "width", "accuracy [95% Wilson]", "chance", "test answers",
                       "CPU s per run"], rows))
        return Section(self.title, md, [], {"probes": data})


