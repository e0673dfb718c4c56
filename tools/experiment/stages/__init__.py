"""The stages of an experiment, run in the order of :data:`STAGES` by ``tools.experiment.run``.

Each stage is one module with one object that follows :class:`~tools.experiment.stages.base.Stage` (``name``,
``trains``, ``wanted(spec)``, ``plan(spec, arms, log)``, ``run(ctx)``) and shares one
:class:`~tools.experiment.stages.base.Context`. To add a stage: write its module (its spec keys, its runs, its
``STAGE``) and add ``its_module.STAGE`` to :data:`STAGES` where it belongs in the order.

- ``tuning``: each arm's lr searched on its own (``<out>/tune/``).
- ``seeded``: every arm x cell x seed at its tuned lr (``<out>/sweep/``; ``init_from``: arms that start from
  another arm's runs; time-matched arms after the runs that set their time).
- ``ceg``: the reference arm's compute curve (``<out>/ceg/``), read by the verdicts.
- ``looks``: a sequential design's later looks, more seeds for the comparisons still open.
- ``finetune``: every arm's pre-trained runs fine-tuned on a labelled task (``<out>/finetune/``).
- ``measure``: the measurements after training (not a training stage: ``report`` runs it again).
"""

from __future__ import annotations

from tools.experiment.stages import ceg, finetune, looks, measure, seeded, tuning
from tools.experiment.stages.base import Context, Stage

STAGES: list[Stage] = [tuning.STAGE, seeded.STAGE, ceg.STAGE, looks.STAGE, finetune.STAGE, measure.STAGE]

__all__ = ["STAGES", "Context", "Stage"]
