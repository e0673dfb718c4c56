"""Routing inspection of an MoE run: how the router behaved over training (``series``, ``health``,
``trace``) and what it learned (``capture`` runs a checkpoint's model, ``checkpoint`` and ``stats`` measure
its decisions), drawn by ``plots`` and written by ``report``; ``python -m analysis.routing`` is ``cli``.
The statistics: docs/methods/routing.md."""
