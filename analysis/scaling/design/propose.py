"""An IsoFLOP grid proposed for a compute range: budgets log-spaced, each with sizes around the law's
N_opt(C) (from one shared ladder, so that WSD trunks serve several budgets), written as a spec."""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from omegaconf import OmegaConf

from analysis.scaling.design.spec import Law
from analysis.scaling.fits.common import json_safe


def _round(x: float, digits: int = 3) -> float:
    return float(f"{x:.{digits}g}")


def propose_grid(flops_min: float, flops_max: float, *, n_budgets: int = 5, n_sizes: int = 7, spread: float = 4.0,
                 law: Law = Law(), ladder: Optional[Sequence[float]] = None) -> dict:
    """An IsoFLOP grid as a spec fragment ``{"budgets": [{"flops": C, "sizes": [N...]}, ...]}``.

    Budgets: ``n_budgets`` log-spaced FLOPs from ``flops_min`` to ``flops_max``. Sizes: one log ladder
    of step r = spread^(2 / (n_sizes - 1)) shared by all budgets (so a WSD trunk serves several); per
    budget the ``n_sizes`` consecutive rungs whose geometric mean is nearest the law's N_opt(C) (within
    a factor sqrt(r)), from about N_opt / spread to N_opt * spread. Sizes are rounded to 3 digits.

    ``ladder``: the sizes that can be built (N values). Each budget then takes the up to ``n_sizes``
    ladder sizes nearest N_opt(C) in ln N among those within [N_opt / spread, N_opt * spread], exactly
    as given; a budget with fewer than 3 there is refused (its IsoFLOP parabola needs 3).
    """
    if not (math.isfinite(flops_min) and flops_min > 0 and math.isfinite(flops_max) and flops_max > flops_min):
        raise ValueError(f"propose_grid: flops range [{flops_min:g}, {flops_max:g}]: need 0 < C_min < C_max")
    if int(n_budgets) != n_budgets or n_budgets < 2:
        raise ValueError(f"propose_grid: n_budgets={n_budgets}: need >= 2 budgets (a slope of N_opt against C)")
    if int(n_sizes) != n_sizes or n_sizes < 3:
        raise ValueError(f"propose_grid: n_sizes={n_sizes}: an IsoFLOP parabola needs >= 3 sizes per budget")
    if not (math.isfinite(spread) and spread > 1):
        raise ValueError(f"propose_grid: spread={spread}: the factor either side of N_opt must be > 1")
    budgets = np.geomspace(flops_min, flops_max, int(n_budgets))
    n_opt = law.n_opt(budgets)
    if ladder is not None:
        return {"budgets": _ladder_grid(budgets, n_opt, ladder, int(n_sizes), spread)}
    log_r = 2.0 * math.log(spread) / (n_sizes - 1)
    base = math.log(n_opt[0] / spread)
    out = []
    for C, n in zip(budgets, n_opt):
        start = round((math.log(n) - base) / log_r - (n_sizes - 1) / 2)
        sizes = [_round(math.exp(base + (start + i) * log_r)) for i in range(int(n_sizes))]
        out.append({"flops": _round(float(C)), "sizes": sizes})
    return {"budgets": out}


def _ladder_grid(budgets: np.ndarray, n_opt: np.ndarray, ladder: Sequence[float], n_sizes: int,
                 spread: float) -> list[dict]:
    """:func:`propose_grid` on a ladder of buildable sizes."""
    rungs = sorted({float(n) for n in ladder})
    bad = [n for n in rungs if not (math.isfinite(n) and n > 0)]
    if not rungs or bad:
        raise ValueError(f"propose_grid: ladder {list(ladder)}: needs positive, finite sizes N")
    out = []
    for C, n in zip(budgets, n_opt):
        near = [r for r in rungs if n / spread <= r <= n * spread]
        near = sorted(sorted(near, key=lambda r: abs(math.log(r / n)))[:n_sizes])
        if len(near) < 3:
            raise ValueError(f"propose_grid: budget {C:.3g} FLOPs (N_opt {n:.3g}): {len(near)} ladder size(s) within "
                             f"x{spread:g} of N_opt ({n / spread:.3g}-{n * spread:.3g}); an IsoFLOP parabola needs 3: "
                             "add sizes there, raise the spread or move the budgets")
        out.append({"flops": _round(float(C)), "sizes": near})
    return out


def _yaml_number(x: float, digits: int = 3) -> str:
    """``digits`` significant digits, always readable as a float by YAML (4.0e+11, not 4e+11)."""
    s = f"{x:.{digits}g}"
    mantissa, _, exp = s.partition("e")
    return (mantissa if "." in mantissa else mantissa + ".0") + (f"e{exp}" if exp else "")


def spec_yaml(spec: dict) -> str:
    """A spec mapping as YAML, with a ``budgets:`` grid one budget per line (sizes to 6 digits: a ladder's
    N as given)."""
    rest = {k: v for k, v in spec.items() if k != "budgets"}
    text = OmegaConf.to_yaml(OmegaConf.create(json_safe(rest))) if rest else ""
    if "budgets" in spec:
        text += "budgets:\n" + "".join(
            f"  - {{flops: {_yaml_number(b['flops'])}, sizes: [{', '.join(_yaml_number(n, 6) for n in b['sizes'])}]}}\n"
            for b in spec["budgets"])
    return text
