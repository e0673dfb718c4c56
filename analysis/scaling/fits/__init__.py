"""Scaling-law fits on arrays (numpy, scipy; no run folders, no plotting): L(C) (``power_law``), the three
estimates of the compute-optimal exponent a in N_opt ∝ C^a (``envelope``: approach 1, ``isoflop``: 2,
``loss_nd``: 3, Hoffmann et al. 2022), seed noise (``noise``) and the held-out prediction (``holdout``).
Degenerate inputs give a named status, never an exception (``common``)."""
