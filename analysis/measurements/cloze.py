"""``cloze: {windows, seed}``: every finished run scored on one held-out id per validation window
(:func:`cloze_scores`: a causal decoder from the left side, an encoder with the mask id there, an
encoder-decoder with a one-id span behind a sentinel), ``windows`` items (default 512) at positions drawn
with ``seed`` (default 0); cached under ``<out>/measurements/cloze/``. The report: per arm the accuracy and
the answer's negative log-likelihood over seeds, the paired difference to the reference arm (same items,
same seeds), and the parameters, memory and speed beside them: the one task arms of different objectives
are compared on. Refused when the runs' tokenizers differ (the items would not be the same text).

The items and the scores: one held-out id per window, predicted by each model type through its own
interface, so that a causal decoder, an encoder and an encoder-decoder are scored on one task.

Shape legend: N items (windows), S window length, V vocabulary, Vt text ids (the tokenizer's; the ids above
are an objective's own: mask, start, sentinels).

Items: ``windows`` validation windows of S = ``train.seq_len`` ids (``archlab.data.eval_windows``: the same for
every run that shares the tokenizer and the corpus), and in each one position p drawn uniformly from
[S/8, 7S/8) by a generator seeded with ``seed`` (so that every model sees S/8 ids or more on each side).
The answer is the id at p:

- decoder (``model.type: decoder``): the next-token distribution after ids[:p], the left side only (what a
  causal LM has; its right side would need a forward per candidate);
- encoder (BERT): the window with the mask id at p, the distribution at p (both sides);
- encoder-decoder (T5): exactly its pre-training format (:func:`span_cloze_inputs`, built by the span
  corruption objective's own ``corrupt``): the window with p replaced by the first sentinel (a one-id span),
  the decoder fed [start, sentinel]: its second distribution (both sides). A T5 whose cloze NLL sits near the
  unigram entropy has not learned to read its encoder for a span's first id: after 400 steps of the spec's
  T5 its pre-training loss on the first id of its first span (its own format, its own masks) is 5.98 nats, at
  the unigram entropy (5.95), while its span loss is 4.87: the span loss is low on the sentinels and the ids
  after a span's first, which the decoder predicts from the ids it has already written.

Each distribution is renormalised over the Vt text ids (the answer is a text id; the reserved ids differ by
objective). Reported: accuracy (argmax == answer) and the mean negative log-likelihood of the answer (nats).
"""

from __future__ import annotations

from pathlib import Path

import torch

from analysis.experiments import (
    Context,
    Section,
    errbar,
    figure_md,
    fmt_bytes,
    fmt_ci,
    fmt_count,
    paired_difference,
    t_interval,
    table,
)
from analysis.measurements.base import Measurement, cached, check_int, measurement_folder, register
from analysis.plotting import COLORS, pyplot, save_figure, style_axes
from archlab.data import eval_windows
from archlab.objectives import token_data
from archlab.objectives.mlm import mask_id
from archlab.objectives.span_corruption import corrupt
from archlab.train.checkpoint import load_model


def cloze_items(tokens, seq_len: int, windows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(windows (N, S), positions (N,)) of the split ``tokens``."""
    batch = next(eval_windows(tokens, seq_len, windows, 1))[:, :seq_len]  # (N, S)
    g = torch.Generator().manual_seed(seed)
    pos = torch.randint(seq_len // 8, seq_len - seq_len // 8, (batch.shape[0],), generator=g)
    return batch, pos


def span_cloze_inputs(x_NS: torch.Tensor, pos_N: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, ...]:
    """(encoder input (N, S), decoder input (N, 3), targets (N, 3)) of span corruption (T5's pre-training format,
    :func:`archlab.objectives.span_corruption.corrupt`) with one noise span: the held-out id alone. The encoder
    reads the window with s_0 in the id's place; the targets are [s_0, id, s_1], the decoder's input [start,
    s_0, id]: the id is the target after [start, s_0], as the first id of the first span in pre-training."""
    noise_NS = torch.zeros(x_NS.shape, dtype=torch.bool)
    noise_NS[torch.arange(x_NS.shape[0]), pos_N] = True
    return corrupt(x_NS, noise_NS, vocab_size, spans=2)  # two sentinels: s_0 before the id, s_1 after it


@torch.no_grad()
def cloze_log_probs(model, kind: str, x_NS: torch.Tensor, pos_N: torch.Tensor, text_ids: int) -> torch.Tensor:
    """(N, Vt) log-probabilities of the id at each item's position, by the model type's interface."""
    V = model.cfg.vocab_size
    rows = torch.arange(x_NS.shape[0])
    if kind == "decoder":
        logits = model(x_NS).logits[rows, pos_N - 1]  # the prediction after ids[:p]
    elif kind == "encoder":
        masked = x_NS.clone()
        masked[rows, pos_N] = mask_id(model.cfg)
        logits = model(masked).logits[rows, pos_N]
    elif kind == "encoder_decoder":
        encoder, decoder, _ = span_cloze_inputs(x_NS, pos_N, V)
        logits = model(encoder, decoder[:, :2]).logits[:, 1]  # the id after [start, s_0]
    else:
        raise ValueError(f"model.type={kind!r}: cloze knows decoder, encoder and encoder_decoder")
    return torch.log_softmax(logits[:, :text_ids].float(), dim=-1)


def cloze_scores(run_dir: str | Path, windows: int = 512, seed: int = 0, batch: int = 64) -> dict:
    """{accuracy, nll, items, model_type, text_ids, tokenizer} of the run's newest checkpoint."""
    model, cfg = load_model(run_dir)
    data = token_data(cfg)  # the tokenizer the run trained with (its objective's reserved ids left free)
    text_ids = int(data.tokenizer.vocab_size)
    x, pos = cloze_items(data.val, int(cfg.train.seq_len), windows, seed)
    if int(x.max()) >= text_ids:
        raise ValueError(f"{run_dir}: validation ids reach {int(x.max())}, past the tokenizer's {text_ids} text ids")
    kind = str(cfg.model.type)
    correct, nll = 0, 0.0
    for i in range(0, x.shape[0], batch):
        lp = cloze_log_probs(model, kind, x[i:i + batch], pos[i:i + batch], text_ids)
        answer = x[i:i + batch].gather(1, pos[i:i + batch, None]).squeeze(1)
        correct += int((lp.argmax(-1) == answer).sum())
        nll += float(-lp.gather(1, answer[:, None]).sum())
    n = x.shape[0]
    return {"accuracy": correct / n, "nll": nll / n, "items": n, "model_type": kind, "text_ids": text_ids,
            "tokenizer": str(data.meta.get("tokenizer", {}).get("sha256") or data.cache_path.name)}



@register
class Cloze(Measurement):
    """One held-out id per window, predicted through each model type's own interface."""

    name = "cloze"
    title = "Cloze: one held-out id per window, each model type through its own interface"
    keys = ("windows", "seed")
    quick = {"windows": 32}

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_int(s, "windows", where)
        check_int(s, "seed", where, minimum=0)
        return s

    loads_checkpoints = True

    def _scored(self, record: dict) -> list[tuple[dict, Path]]:
        """(run, cache file) of every finished run (each arm's seeded runs)."""
        folder = measurement_folder(record) / self.name
        return [(run, folder / f"{run['point']}.json") for run in record["runs"]
                if (Path(run["run_dir"]) / "summary.json").is_file()]

    def checkpoints(self, record: dict) -> dict[str, Path]:
        return {run["run_dir"]: path for run, path in self._scored(record)}

    def run(self, record: dict, log=print) -> list[dict]:
        m = self.settings(record)
        windows, seed = int(m.get("windows", 512)), int(m.get("seed", 0))
        out = []
        for run, path in self._scored(record):
            if not path.is_file():
                log(f"cloze: {run['point']}")
            settings = {"windows": windows, "seed": seed, "run_dir": run["run_dir"]}
            result = cached(path, settings, lambda: cloze_scores(run["run_dir"], windows, seed))
            out.append({"arm": run["arm"], "seed": run["seed"], "point": run["point"], "result": result})
        tokenizers = {r["result"]["tokenizer"] for r in out}
        if len(tokenizers) > 1:
            raise ValueError(f"cloze: the runs' tokenizers differ ({sorted(tokenizers)}): the items would not be the "
                             "same text; give every arm the same BPE size (model.vocab_size less the ids its "
                             "objective reserves)")
        return out

    def section(self, ctx: Context) -> Section:
        results = ctx.measures.get("cloze") or []
        by_arm: dict[str, dict[int, dict]] = {}
        for r in results:
            by_arm.setdefault(r["arm"], {})[r["seed"]] = r["result"]
        groups = ctx.spec.budget_groups()  # each arm against the reference of its own pre-training budget
        ref_of = {name: arms.get(ctx.spec.base_reference(), ctx.reference) for _, _, arms in groups
                  for name in arms.values()}
        rows, data = [], []
        for g in ctx.arm_groups():
            res = by_arm.get(g.arm)
            if not res:
                continue
            reference = ref_of.get(g.arm, ctx.reference)
            ref = by_arm.get(reference, {})
            acc = {s: x["accuracy"] for s, x in res.items()}
            nll = {s: x["nll"] for s, x in res.items()}
            d = {"arm": g.arm, "label": g.label, "model_type": next(iter(res.values()))["model_type"],
                 "accuracy": t_interval(list(acc.values())), "nll": t_interval(list(nll.values())),
                 "reference": reference,
                 "vs_reference_accuracy": paired_difference(acc, {s: x["accuracy"] for s, x in ref.items()})
                 if g.arm != reference and ref else None,
                 "vs_reference_nll": paired_difference(nll, {s: x["nll"] for s, x in ref.items()})
                 if g.arm != reference and ref else None,
                 "params": g.costs["params_total"], "tokens_per_s": g.speed(),
                 "train_memory_bytes": g.costs.get("train_memory_bytes"), "activation_bytes": g.costs.get(
                     "activation_bytes"), "peak_rss_bytes": g.measured()["peak_rss_bytes"]}
            data.append(d)
            named = f"vs `{reference}`: " if len(groups) > 1 else ""
            vs = (f"{named}{fmt_ci(d['vs_reference_accuracy'], signed=True)} / "
                  f"{fmt_ci(d['vs_reference_nll'], signed=True)}" if d["vs_reference_accuracy"] else "reference")
            rows.append([f"{g.label} (`{g.arm}`)", d["model_type"], fmt_ci(d["accuracy"]), fmt_ci(d["nll"]), vs,
                         fmt_count(d["params"]), fmt_count(d["tokens_per_s"]),
                         f"{fmt_bytes(d['train_memory_bytes'])} ({fmt_bytes(d['activation_bytes'])} activations)",
                         fmt_bytes(d["peak_rss_bytes"])])
        items = next(iter(results), {}).get("result", {}).get("items", 0)
        md = (f"{items} validation windows, one id each at a position drawn uniformly from [S/8, 7S/8); the same "
              "items for every run (one tokenizer). A causal decoder predicts it from the ids before it only; an "
              "encoder from both sides (the mask id in its place); an encoder-decoder from both sides (a one-id "
              "span behind its first sentinel, the decoder fed [start, sentinel]). Distributions renormalised over "
              "the text ids. Intervals: 95% t over seeds; differences paired by seed"
              + (", each arm against the reference of its own pre-training budget" if len(groups) > 1 else "")
              + ".\n\n"
              + "Memory: the cost model's training step (fp32 weights, gradients and AdamW states, and the "
              "activations of one micro batch; `archlab.costs.training_memory`) and the runs' measured peak resident "
              "memory (the whole process: Python, torch, the corpus).\n\n"
              + table(["arm", "model type", "accuracy [95% CI]", "NLL of the answer (nats) [95% CI]",
                       "vs its budget's reference: accuracy / NLL (paired)" if len(groups) > 1
                       else f"vs `{ctx.reference}`: accuracy / NLL (paired)", "params", "tokens/s",
                       "training memory (cost model)", "peak RSS (measured)"], rows))
        figures: list[str] = []
        md += figure_md(figures, plot_cloze(data, ctx.out / "cloze.png"), "cloze accuracy and NLL per arm")
        return Section(self.title, md, figures, {"arms": data})


def plot_cloze(data: list[dict], path):
    """Left: accuracy per arm; right: the answer's NLL per arm; each with its interval over seeds."""
    pts = [d for d in data if d["accuracy"].get("mean") is not None]
    if not pts:
        return None
    plt = pyplot()
    fig, (ax_a, ax_n) = plt.subplots(1, 2, figsize=(12, 0.5 * len(pts) + 2.2), sharey=True)
    for i, d in enumerate(pts):
        y = len(pts) - 1 - i
        for ax, key in ((ax_a, "accuracy"), (ax_n, "nll")):
            iv = d[key]
            ax.errorbar([iv["mean"]], [y], xerr=errbar(iv), fmt="o", color=COLORS[i % len(COLORS)], capsize=4)
    ax_a.set_yticks(range(len(pts)), [d["label"] for d in reversed(pts)])
    style_axes(ax_a, "Cloze accuracy (95% CI over seeds)", "accuracy (share of items, higher is better)", "arm",
               legend=False, grid="x")
    style_axes(ax_n, "NLL of the held-out id (95% CI)", "negative log-likelihood (nats, lower is better)", "",
               legend=False, grid="x")
    fig.tight_layout()
    return save_figure(fig, path)
