"""``val_sampling: {}``: the validation set's own sampling error beside the seed intervals.

Each seeded run's final weights are evaluated on the trainer's own validation windows, one loss
per window (:func:`window_losses`; cached under ``<out>/measurements/``). Per arm,
the 95% bootstrap half-width over windows of each run's mean loss (the mean over seeds) is set
beside the half-width of the arm's seed t-interval; per arm and seed, the bootstrap half-width of
the mean per-window difference against the reference run of the same seed (the same windows) beside
the half-width of the paired seed interval. The rule, on the paired differences the verdicts rest
on: the validation error is at most a third of the seed error (standard errors); the table says where it holds.
No settings.

Why: a final validation loss is a mean over the validation windows the trainer evaluates
(``archlab.data.eval_windows``: ``train.eval_batches x micro_batch_size`` non-overlapping windows
strided evenly over the whole validation split, so they are spread over its documents, not one
contiguous slice). A different draw of validation text would give a different mean; that error is
estimated by resampling the windows (the bootstrap over validation windows, each window a piece of
one document or of a few neighbouring ones):

- per run: the 95% bootstrap half-width of its mean window loss;
- per pair of runs of two arms with the same seed, evaluated on the same windows: the 95% half-width
  of the mean per-window difference (the windows' shared difficulty cancels, so it is much
  narrower than either run's own).

The report compares them with the seed intervals (the
t-interval over seeds of an arm's loss and of its paired difference against the reference): the
validation set is large enough when its own error is at most a third of the seed error it sits beside
(standard errors: the t quantile of a 3-seed interval would otherwise make the rule 2.2x laxer).

    losses_W = window_losses("runs/experiments/attention-kv/sweep/mha-seed0-flop4.2e12")  # (W,)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from analysis import eval_error, val_bootstrap
from analysis.experiments import Context, Section, table
from analysis.measurements.base import Measurement, cached, measurement_folder, register
from analysis.runs import open_run
from archlab.data import eval_windows
from archlab.objectives import token_data
from archlab.objectives.causal_lm import CausalLM
from archlab.train.checkpoint import load_model


@torch.no_grad()
def window_losses(run_dir: str | Path) -> np.ndarray:
    """Mean next-token loss of each validation window the trainer evaluated at the end, with the
    run's final weights: (W,) float64, W = train.eval_batches x train.micro_batch_size (or fewer on a
    short split). The mean of the result is the run's final validation loss (same windows, same
    weights; fp32 on CPU)."""
    model, cfg = load_model(run_dir)
    t = cfg.train
    data = token_data(cfg)
    S = int(t.seq_len)
    out = []
    for x_BS1 in eval_windows(data.val, S, int(t.micro_batch_size), int(t.eval_batches)):
        inputs_BS, targets_BS = CausalLM.split(x_BS1, 1)
        logits_BSV = model(inputs_BS).logits
        loss_BS = F.cross_entropy(logits_BSV.float().flatten(0, 1), targets_BS.flatten(), reduction="none")
        out.append(loss_BS.view(x_BS1.shape[0], S).mean(1).double())
    return torch.cat(out).numpy()


RATIO = eval_error.RATIO  # validation sampling error / seed error (standard errors): at most this


def _f(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.4f}"


def _half(iv: Optional[dict]) -> Optional[float]:
    if not iv or iv.get("low") is None:
        return None
    return (iv["high"] - iv["low"]) / 2


@register
class ValSampling(Measurement):
    """How much of an interval is the validation set's draw rather than the seeds'."""

    name = "val_sampling"
    title = "Validation sampling error"

    loads_checkpoints = True

    def _scored(self, record: dict) -> list[tuple[dict, Path]]:
        """(run, cache file) of every finished run."""
        folder = measurement_folder(record) / "val_sampling"
        out = []
        for r in record["runs"]:
            try:
                finished = open_run(r["run_dir"]).status == "finished"
            except Exception:  # a missing or broken run: the report lists it elsewhere
                finished = False
            if finished:
                out.append((r, folder / f"{r['point']}.json"))
        return out

    def checkpoints(self, record: dict) -> dict[str, Path]:
        return {r["run_dir"]: path for r, path in self._scored(record)}

    def run(self, record: dict, log=print) -> dict:
        out = {}
        for r, path in self._scored(record):
            if not path.is_file():
                log(f"val_sampling: {r['point']}")
            out[r["point"]] = cached(path, {"run_dir": r["run_dir"]},
                                     lambda r=r: [float(x) for x in window_losses(r["run_dir"])])
        return out

    def section(self, ctx: Context) -> Section:
        windows = ctx.measures.get(self.name) or {}
        ref = ctx.group(ctx.reference)
        rows, data = [], {}
        for g in ctx.arm_groups():
            own = [val_bootstrap.bootstrap_mean_interval(windows[r["point"]])["half_width"]
                   for r in g.runs.values() if r["point"] in windows]
            paired = []
            if ref is not None and g.arm != ctx.reference:
                for s, r in g.runs.items():
                    rr = ref.runs.get(s)
                    if rr and r["point"] in windows and rr["point"] in windows:
                        paired.append(val_bootstrap.paired_bootstrap_difference(windows[r["point"]],
                                                                       windows[rr["point"]])["half_width"])
            seed_half, pair_half = _half(g.loss), _half(g.vs_reference)
            v_own = sum(own) / len(own) if own else None
            v_pair = sum(paired) / len(paired) if paired else None
            n_win = len(windows[next(iter(g.runs.values()))["point"]]) if own else 0
            # the rule is on the paired difference, which every verdict rests on: the absolute loss's own
            # validation error is shared by every arm (the same windows) and cancels from the comparisons
            # on standard errors (a 95% half-width / 1.96 against the seeds' sd / sqrt(seeds)), not on the
            # half-widths, whose t quantile at 3-5 seeds (4.30-2.78) would make the rule up to 2.2x laxer
            pair = g.vs_reference or {}
            pair_se = pair["sd"] / pair["n"] ** 0.5 if pair.get("sd") and pair.get("n", 0) > 1 else None
            ok = [v_pair / eval_error.Z95 <= RATIO * pair_se] if v_pair is not None and pair_se else []
            data[g.arm] = {"windows": n_win, "val_half_width": v_own, "seed_half_width": seed_half,
                           "val_paired_half_width": v_pair, "seed_paired_half_width": pair_half,
                           "within_a_third": all(ok) if ok else None}
            rows.append([f"{g.label} (`{g.arm}`)", n_win, _f(v_own), _f(seed_half), _f(v_pair), _f(pair_half),
                         "-" if not ok else ("yes" if all(ok) else "**no**")])
        md = ("95% half-widths in nats. Validation: the bootstrap over the validation windows (each run's final "
              "weights on the trainer's windows, strided over the whole validation split; the mean over seeds). "
              "Seeds: the t-interval over seeds. Paired: the same for the difference against the reference run of the "
              "same seed (the same windows, so their shared difficulty cancels). The verdicts rest on the paired "
              "differences, so the rule (validation error at most a third of the seed error, both as standard "
              "errors: the half-width / 1.96 and the seeds' sd / sqrt(seeds)) is checked there; the "
              "absolute loss's validation error is the same draw of text for every arm and says how far the losses "
              "themselves could move on other text of this corpus.\n\n"
              + table(["arm", "windows", "validation (loss)", "seeds (loss)", "validation (paired)", "seeds (paired)",
                       "paired: validation <= 1/3 of seeds"], rows))
        return Section(self.title, md, [], {"arms": data, "ratio": RATIO})
