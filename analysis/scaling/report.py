"""The whole study of a set of run folders: read, fit every family, compare, and write fits.json,
fits.md and the figures (:func:`analyse`)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Optional, Sequence

from analysis.runs import RunError, expand_inputs, write_json_atomic, write_text_atomic
from analysis.scaling.compare import compare_dense_moe, compute_multipliers, equal_params_comparison, family_pairs
from analysis.scaling.fits.common import OK, json_safe
from analysis.scaling.fits.holdout import HOLDOUT_BY
from analysis.scaling.fits.noise import pooled_std
from analysis.scaling.plots import (
    compute_multiplier_skip,
    dense_vs_moe_skip,
    plot_compute_multiplier,
    plot_dense_vs_moe,
    plot_isoflop,
    plot_loss_nd,
    plot_loss_vs_flops,
    plot_loss_vs_tokens,
)
from analysis.scaling.prediction import prediction_rows, read_prediction
from analysis.scaling.read import N_KINDS, average_seeds, budget_convention, collect, n_of_counts, n_params
from analysis.scaling.study import family_design_noise, fit_families, n_sensitivity, n_sensitivity_studies, study_family
from analysis.scaling.tables import (
    comparison_table,
    design_noise_table,
    equal_params_table,
    exponent_table,
    fits_table,
    holdout_table,
    isoflop_table,
    multiplier_table,
    n_sensitivity_table,
    nd_table,
    noise_table,
    optimum_table,
    points_table,
    prediction_table,
)


def _relative(path: str) -> str:
    """``path`` relative to the working folder when it lies inside it, else as given."""
    p, here = Path(path), Path.cwd().resolve()
    return str(p.relative_to(here)) if p.is_absolute() and p.is_relative_to(here) else path


# every output; dense_vs_moe.png and compute_multiplier.png only where they have something to show
OUTPUTS = ("loss_vs_flops.png", "loss_vs_tokens.png", "dense_vs_moe.png", "isoflop.png", "loss_nd.png",
           "compute_multiplier.png", "fits.json", "fits.md")


def analyse(inputs: Sequence[str], out: Optional[Path], n_boot: int = 200, huber_delta: float = 1e-3,
            seed: int = 0, *, n_kind: str = "total", budget_tolerance: float = 0.1,
            ref_flops: Optional[float] = None, holdout: Optional[str] = "size", pairs: Optional[Sequence[str]] = None,
            reference: Optional[str] = None, n_polish: Optional[int] = 20,
            predictions: Optional[Sequence[str]] = None, keep_unlearned: bool = False, log=print) -> dict:
    """Read the runs, fit each family (L(C) and approaches 1-3), write the plots and tables to
    ``out`` (a figure with nothing to show is not written: ``log`` says why; ``figures`` lists those written);
    return the results (what fits.json holds, plus ``studies``: FamilyStudy per family, and
    ``sensitivity_studies``: family -> N kind -> FamilyStudy). ``holdout``: "size" | "budget" | None,
    what approach 3 predicts without having seen it; ``pairs`` ("REF:FAM") or ``reference``: the
    families compared as compute multipliers; ``n_polish``: grid starts polished per L(N, D) fit;
    ``predictions`` ("FAM=PATH[:DESIGN_FAMILY]"): designs whose predicted widths are set beside the obtained ones;
    ``keep_unlearned``: keep runs near the unigram entropy as points (see :func:`collect`)."""
    if n_kind not in N_KINDS:
        raise ValueError(f"--n-kind {n_kind!r}: valid are {', '.join(N_KINDS)}")
    if holdout is not None and holdout not in HOLDOUT_BY:
        raise ValueError(f"--holdout {holdout!r}: valid are {', '.join(HOLDOUT_BY)}, none")
    runs, problems = expand_inputs(inputs)
    run_points, excluded, run_curves = collect(runs, keep_unlearned)
    excluded = [{"run": p, "status": "unreadable", "reason": why} for p, why in problems] + excluded
    for e in excluded:  # paths as the user gave them (relative to the working folder), not this machine's
        e["run"] = _relative(e["run"])
    if not run_points:
        raise RunError("no finished run among the inputs: " +
                       "; ".join(f"{e['run']}: {e['reason']}" for e in excluded))
    points, curves, seed_losses = average_seeds(run_points, run_curves)
    preds = [read_prediction(spec, sorted({p.family for p in points})) for spec in predictions or []]
    noise = {fam: pooled_std(g) for fam, g in sorted(seed_losses.items())}
    overall = pooled_std([g for gs in seed_losses.values() for g in gs])
    dnoise = {fam: family_design_noise([p for p in points if p.family == fam]) for fam in noise}
    fits = fit_families(points, n_boot, huber_delta, seed)
    pair_list = family_pairs(list(fits), pairs, reference)
    comparisons = compare_dense_moe(points, fits)
    fit_kw = dict(n_boot=n_boot, huber_delta=huber_delta, seed=seed, budget_tolerance=budget_tolerance,
                  ref_flops=ref_flops, n_polish=n_polish)
    studies = {fam: study_family([p for p in points if p.family == fam], curves.get(fam, []), noise[fam],
                                 n_kind=n_kind, holdout=holdout, **fit_kw)
               for fam in sorted(fits)}
    sens = n_sensitivity_studies(points, studies, noise, n_kind, **fit_kw)
    is_moe = {fam: any(p.is_moe for p in points if p.family == fam) for fam in studies}
    multipliers = compute_multipliers(sens, pair_list, n_kind, is_moe)
    equal_params = [equal_params_comparison(sens[ref]["non_embedding"], [p for p in points if p.family == fam],
                                            loss_sd=next((nf.std for nf in (noise[fam], overall) if nf.status == OK),
                                                         None), seed=seed)
                    for ref, fam in pair_list if is_moe.get(fam) and not is_moe.get(ref)]
    result = {
        "model": "L(C) = E + A * C^(-alpha); C = training FLOPs, L = final validation loss (nats/token)",
        "fit": {"loss": "huber on log L", "huber_delta": huber_delta, "bootstrap_resamples": n_boot,
                "interval": "95% percentile bootstrap: over points (>= 6 points) else over log-L residuals",
                "seed": seed},
        "families": {fam: {**f.to_json(), "points": [asdict(p) for p in points if p.family == fam]}
                     for fam, f in fits.items()},
        "n_kind": {"name": n_kind, "meaning": N_KINDS[n_kind]},
        "loss_nd_model": "L(N, D) = E + A / N^alpha + B / D^beta; N parameters (n_kind), D tokens seen; "
                         "Huber (delta huber_delta) on log L, L-BFGS-B from the Hoffmann et al. grid; compute-optimal "
                         "for C = k N D with k the measured training FLOPs per token per parameter (and k = 6)",
        "scaling_nd": {fam: st.to_json() for fam, st in studies.items()},
        "exponents": {fam: json_safe(st.exponents()) for fam, st in studies.items()},
        "n_sensitivity": n_sensitivity(sens),
        "approaches_2_and_3": {fam: json_safe(st.agreement()) for fam, st in studies.items()},
        "holdout": {fam: st.holdout.to_json() for fam, st in studies.items() if st.holdout is not None},
        "compute_multipliers": [c.to_json() for c in multipliers],
        "design_vs_obtained": [{"family": pr["family"], "design": pr["path"], "design_family": pr["design_family"],
                                "rows": json_safe(prediction_rows(pr, studies, multipliers))} for pr in preds],
        "moe_at_equal_params": equal_params,
        "noise": {"overall": overall.to_json(), "families": {fam: nf.to_json() for fam, nf in noise.items()},
                  "design": {fam: d.to_json() for fam, d in dnoise.items()}},
        "excluded": excluded,
        "budget_convention": budget_convention(points),
        "dense_vs_moe": comparisons,
    }
    floor = (f"Noise floor (pooled std over {overall.n_groups} seed groups, {overall.dof} dof): "
             f"**{overall.std:.4f} nats**." if overall.status == OK else f"Noise floor: unknown ({overall.message}).")
    text = "\n\n".join([
        "## Fitted L(C) = E + A * C^(-alpha) per family", fits_table(fits),
        f"## Fitted L(N, D) = E + A / N^alpha + B / D^beta (approach 3; N = {N_KINDS[n_kind]})", nd_table(studies),
        "## Compute-optimal allocation from L(N, D)", optimum_table(studies),
        "## IsoFLOP profiles (approach 2)", isoflop_table(studies),
        f"Budgets C count: {budget_convention(points) or '(no points)'}.",
        "## Exponent a of N_opt ∝ C^a: three estimates (95% intervals)", exponent_table(studies),
        "## Sensitivity to the definition of N (approaches 3 and 2 refitted under each)",
        n_sensitivity_table(sens, n_kind),
        f"## Held-out prediction (approach 3 without the largest {holdout})" if holdout else
        "## Held-out prediction", holdout_table(studies) if holdout else "(not asked for: --holdout none)",
        "## Families as compute multipliers", multiplier_table(multipliers),
        "## The designer's prediction against the study", prediction_table(preds, studies, multipliers),
        "## MoE at equal active and equal total parameters", equal_params_table(equal_params),
        "## Seed noise", floor, noise_table(noise, overall), design_noise_table(dnoise),
        "## Points (finished runs; seed groups at their mean)", points_table(points, n_kind),
        "## Dense vs MoE", comparison_table(comparisons),
        "## Excluded runs", "\n".join(f"- {e['run']}: {e['status']} ({e['reason']})" for e in excluded) or "(none)",
    ])
    result["table_markdown"] = text
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "fits.json", json_safe(result))
        write_text_atomic(out / "fits.md", text + "\n")
        by_family: dict[str, list] = {}
        for r in runs:
            if r.status == "finished":
                by_family.setdefault(r.family, []).append(r)
        plot_loss_vs_flops(points, fits, curves, out / "loss_vs_flops.png")
        plot_loss_vs_tokens(by_family, out / "loss_vs_tokens.png", lambda r: n_of_counts(r.params, n_kind),
                            N_KINDS[n_kind])
        plot_isoflop(studies, N_KINDS[n_kind], out / "isoflop.png")
        plot_loss_nd(studies, N_KINDS[n_kind], out / "loss_nd.png")
        written = ["loss_vs_flops.png", "loss_vs_tokens.png", "isoflop.png", "loss_nd.png"]
        for name, why, draw in (
                ("dense_vs_moe.png", dense_vs_moe_skip(points), lambda path: plot_dense_vs_moe(
                    points, fits, path, lambda p: n_params(p, "active"), N_KINDS["active"])),
                ("compute_multiplier.png", compute_multiplier_skip(multipliers),
                 lambda path: plot_compute_multiplier(multipliers, N_KINDS, path))):
            if why:
                log(f"scaling: {name} not written: {why}")
            else:
                draw(out / name)
                written.append(name)
        result["figures"] = written
    result["studies"] = studies
    result["sensitivity_studies"] = sens
    return result
