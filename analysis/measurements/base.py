"""What a measurement is (:class:`Measurement`), the one registry of them (:data:`MEASUREMENTS`,
filled by :func:`register` as each measurement's module is imported), the cache of what a
measurement computes (:func:`cached`) and the checks its settings use (:func:`check_int`,
:func:`check_ints`, :func:`check_names`). Imports no measurement.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from analysis.experiment_spec import Arm, Spec
from archlab.errors import RecipeError
from archlab.io import write_json_atomic

if TYPE_CHECKING:
    from analysis.experiments import Context, Section


class Measurement:
    """One measurement an experiment spec can name (``measurements: {name: settings}``).

    - :attr:`keys`: the settings it accepts; :meth:`check` rejects any other, and bad values, when
      the spec loads (``tools.experiment.load.load_spec``), naming the key.
    - :attr:`quick`: the settings ``--quick`` gives it (the spec's ``quick.measurements`` go over them).
    - :meth:`run`: what it computes beyond the run folders, after training (``tools.experiment
      .measure``), cached under ``<out>/measurements/``; None (the default): nothing to compute.
    - :meth:`section`: its section of the report; :attr:`last`: after every other measurement's.
    - :meth:`checkpoints`: the runs whose checkpoints :meth:`run` loads and the cache file each result goes to
      (``tools.experiment archive`` keeps a run's checkpoints until its cache exists); :attr:`loads_checkpoints`.
    """

    name: str = ""
    title: str = ""  # the title of its report section
    keys: tuple[str, ...] = ()
    quick: Optional[dict] = None
    last: bool = False
    loads_checkpoints: bool = False  # True: :meth:`checkpoints` names the runs it scores

    def check(self, settings: Optional[dict], where: str) -> dict:
        """The settings (``{}`` for none) if every key is one of :attr:`keys`; else a RecipeError
        naming the unknown keys. Subclasses check the values too."""
        if settings is None:
            return {}
        if not isinstance(settings, dict):
            raise RecipeError(f"{where}={settings!r}: expected a mapping of settings "
                              f"({', '.join(self.keys) or 'none: write {}'})")
        unknown = sorted(set(settings) - set(self.keys))
        if unknown:
            raise RecipeError(f"{where}: unknown keys {unknown}; valid: {', '.join(self.keys) or 'none (write {})'}")
        return dict(settings)

    def settings(self, record: dict) -> dict:
        """The settings the record's spec gives this measurement (``{}`` for none)."""
        return Spec.from_dict(record["spec"]).wanted.get(self.name) or {}

    parallel = False  # True: run() takes jobs=N and computes N things at a time

    def run(self, record: dict, log=print) -> Optional[Any]:
        """Compute what the report needs beyond the run folders (cached); None: nothing to compute."""
        return None

    def checkpoints(self, record: dict) -> dict[str, Path]:
        """{run folder: the cache file of its result} of the runs whose checkpoints :meth:`run` loads (none here)."""
        return {}

    def section(self, ctx: Context) -> Section:
        raise NotImplementedError(f"measurement {self.name}: no report section")


MEASUREMENTS: dict[str, Measurement] = {}


def register(cls: type[Measurement]) -> type[Measurement]:
    """Class decorator: add one instance of the measurement to :data:`MEASUREMENTS` under its name."""
    if not cls.name or cls.name in MEASUREMENTS:
        raise ValueError(f"measurement {cls.__name__}: name {cls.name!r} is empty or already registered")
    MEASUREMENTS[cls.name] = cls()
    return cls


# --------------------------------------------------------------------------------------------
# settings checks
# --------------------------------------------------------------------------------------------


def _is_int(v, minimum: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= minimum


def check_int(settings: dict, key: str, where: str, minimum: int = 1) -> None:
    """``settings[key]``, when given, is an integer >= ``minimum``."""
    if key in settings and not _is_int(settings[key], minimum):
        raise RecipeError(f"{where}.{key}={settings[key]!r}: expected an integer >= {minimum}")


def check_ints(settings: dict, key: str, where: str, minimum: int = 1) -> None:
    """``settings[key]``, when given, is a non-empty list of integers >= ``minimum``."""
    v = settings.get(key)
    if key in settings and not (isinstance(v, list) and v and all(_is_int(x, minimum) for x in v)):
        raise RecipeError(f"{where}.{key}={v!r}: expected a list of integers >= {minimum}, e.g. [{minimum}]")


def check_names(settings: dict, key: str, where: str) -> None:
    """``settings[key]``, when given, is a list of arm names."""
    v = settings.get(key)
    if key in settings and not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
        raise RecipeError(f"{where}.{key}={v!r}: expected a list of arm names")


# --------------------------------------------------------------------------------------------
# the cache of computed results
# --------------------------------------------------------------------------------------------


def cached(path: Path, settings: dict, compute: Callable[[], Any]) -> Any:
    """The result stored at ``path`` if it was computed with ``settings``, else compute and store it
    (JSON: ``{"settings", "result", "wall_s", "cpu_s"}``; changed settings recompute it). ``cpu_s``: the process
    CPU time the computation took (user + system, its finished child processes included), which the report's
    CPU-hours add up (``analysis.cpu_hours``)."""
    if path.is_file():
        try:
            stored = json.loads(path.read_text())
            if stored.get("settings") == settings:
                return stored["result"]
        except ValueError:
            pass
    t0, wall0 = os.times(), time.perf_counter()
    result = compute()
    t1 = os.times()
    cpu_s = sum(getattr(t1, k) - getattr(t0, k) for k in ("user", "system", "children_user", "children_system"))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"settings": settings, "result": result, "wall_s": round(time.perf_counter() - wall0, 3),
                             "cpu_s": round(cpu_s, 3)}, sort_keys=False)
    return result


def record_arms(record: dict) -> list[Arm]:
    """The record's arms (``experiment.json`` keeps them as ``Arm.to_dict()``), in its order."""
    return [Arm.from_dict(a) for a in record["arms"]]


def measurement_folder(record: dict) -> Path:
    """``<out>/measurements``: where the measurements cache what they compute."""
    return Path(Spec.from_dict(record["spec"]).out) / "measurements"
