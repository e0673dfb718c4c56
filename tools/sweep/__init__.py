"""Scaling sweeps: a grid of recipes x sizes x overrides trained at token or FLOP budgets (``python -m tools.sweep``;
the method and the spec's keys: :mod:`tools.sweep.cli`'s help).

One job per module: ``point`` (a run of the sweep), ``plan`` (the grid as planned points), ``cooldown`` (WSD
trunks and branches), ``manifest`` (the sweep folder's record), ``schedule`` (training the points), ``status``
(where a sweep stands), ``archive`` (``--archive`` / ``--restore``), ``cli``. The names below are those the
experiment runner (``tools.experiment*``) uses as ``sweep.<name>``; other code imports from the modules.
"""

from tools.sweep.cooldown import COOLDOWN_OWNED, cooldown_spec
from tools.sweep.manifest import MANIFEST, is_done, read_manifest, run_dir_state, run_state
from tools.sweep.plan import _as_override_list, _grid_items, plan_points
from tools.sweep.point import Point, _safe
from tools.sweep.schedule import Stopped, run_sweep

__all__ = ["COOLDOWN_OWNED", "MANIFEST", "Point", "Stopped", "_as_override_list", "_grid_items", "_safe",
           "cooldown_spec", "is_done", "plan_points", "read_manifest", "run_dir_state", "run_state", "run_sweep"]
