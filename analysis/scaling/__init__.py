"""Scaling laws from run folders: L(C) per family, the parametric L(N, D), IsoFLOP profiles, the
compute-optimal allocation and three estimates of its exponent, with seed noise; and, before training,
the designer that says how precisely a planned grid will determine them.

    python -m analysis.scaling RUNS... --out DIR   # the study (cli, report)
    python -m analysis.scaling design SPEC         # before training (design/)

One job per module: ``read`` (run folders -> points), ``fits/`` (the numerics on arrays), ``study`` (one
family's approaches 1-3), ``compare`` (dense vs MoE, compute multipliers), ``prediction`` (the design
against the result), ``tables``, ``plots``, ``report`` (everything into fits.json, fits.md and the
figures), ``cli``. The method: docs/methods/scaling.md.
"""
