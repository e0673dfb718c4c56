"""``mad: {tasks, arms, widths, layers, steps, batch, lr, test_answers, seeds}``: the MAD synthetic tasks (Poli
et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures"; ``archlab.data.probes``). ``tasks``: a
list of task names, or a mapping of each name to its settings (e.g. ``{noisy_recall: {frac_noise: 0.4}}``);
default in-context recall, noisy recall and selective copying at their CPU defaults. Each listed arm (default: all)
is trained from scratch on each task and width and scored at the answer positions (``analysis.probe_measurement``).
"""

from __future__ import annotations

from analysis.measurements.base import register
from analysis.probe_measurement import TRAIN_KEYS, ProbeMeasurement
from archlab.data.probes import probe_task
from archlab.errors import RecipeError

DEFAULT_TASKS = ["in_context_recall", "noisy_recall", "selective_copying"]


@register
class MAD(ProbeMeasurement):
    """MAD task accuracy per arm, task and width."""

    name = "mad"
    title = "MAD synthetic tasks"
    keys = TRAIN_KEYS + ("tasks",)
    intro = ("MAD tasks (Poli et al. 2024): in-context recall (a key's value from earlier pairs), noisy recall "
             "(the same through noise ids), selective copying (ids scattered among blanks, written back in order).")

    def tasks(self, settings: dict, where: str) -> list:
        tasks = settings.get("tasks", DEFAULT_TASKS)
        if isinstance(tasks, list) and all(isinstance(t, str) for t in tasks):
            tasks = {t: {} for t in tasks}
        if not isinstance(tasks, dict) or not all(isinstance(v, dict) or v is None for v in tasks.values()):
            raise RecipeError(f"{where}.tasks={tasks!r}: expected a list of task names or a mapping of each name to "
                              "its settings, e.g. [in_context_recall, selective_copying]")
        out = []
        for name, task_settings in tasks.items():
            task = probe_task(name, task_settings or {})
            out.append((", ".join(f"{k}={v}" for k, v in (task_settings or {}).items()) or "defaults", task))
        return out
