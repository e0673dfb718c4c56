"""``throughput: {steps, rounds}``: the training step of every arm timed side by side in this
process, interleaved in ``rounds`` rounds (default 5) of ``steps`` steps (default 10) of each arm
(``analysis.throughput``), so that the arms' tokens/s compare under the same machine load; cached
as ``<out>/measurements/throughput.json``. ``tools.experiment`` runs it before the time-matched
arms train (their budgets use these speeds); the cost tables show it; its section comes last.
"""

from __future__ import annotations

from analysis.experiments import Context, Section, fmt_count, table
from analysis.measurements.base import Measurement, cached, check_int, measurement_folder, register


@register
class Throughput(Measurement):
    """Every arm's tokens/s, measured side by side."""

    name = "throughput"
    title = "Throughput, measured side by side"
    keys = ("steps", "rounds")
    quick = {"steps": 2, "rounds": 2}
    last = True

    def check(self, settings, where: str) -> dict:
        s = super().check(settings, where)
        check_int(s, "steps", where)
        check_int(s, "rounds", where)
        return s

    def run(self, record: dict, log=print) -> dict:
        """{arm: {"tokens_per_s", "rounds", ...}} of the interleaved benchmark; arms that train the same
        model (the same recipe and overrides, e.g. a time-matched copy) are timed once."""
        from analysis.throughput import benchmark

        m = self.settings(record)
        steps, rounds = int(m.get("steps", 10)), int(m.get("rounds", 5))
        threads = record.get("threads")
        models: dict[str, tuple[str, list]] = {}  # first arm of each distinct model -> (recipe, overrides)
        same_as: dict[str, str] = {}
        for a in record["arms"]:
            first = next((n for n, spec in models.items() if spec == (a["recipe"], a["overrides"])), None)
            if first is None:
                models[a["name"]] = (a["recipe"], a["overrides"])
            same_as[a["name"]] = first or a["name"]
        settings = {"steps": steps, "rounds": rounds, "threads": threads,
                    "arms": {n: list(spec) for n, spec in models.items()}}
        path = measurement_folder(record) / "throughput.json"
        if not path.is_file():
            log(f"throughput: {len(models)} models, {rounds} interleaved rounds of {steps} steps")
        timed = cached(path, settings, lambda: benchmark(models, steps=steps, rounds=rounds, threads=threads))
        return {name: {**timed[first], "timed_as": first} for name, first in same_as.items()}

    def section(self, ctx: Context) -> Section:
        bench = ctx.measures.get("throughput") or {}
        ref = bench.get(ctx.reference, {}).get("tokens_per_s")
        rows, data = [], []
        for name, b in bench.items():
            rounds = b["rounds"]
            rel = b["tokens_per_s"] / ref if ref else None
            data.append({"arm": name, **b, "relative_to_reference": rel})
            rows.append([f"{ctx.arms[name]['label']} (`{name}`)", fmt_count(b["tokens_per_s"]),
                         f"{fmt_count(min(rounds))} - {fmt_count(max(rounds))}", f"{rel:.2f}" if rel else "-",
                         fmt_count(ctx.arms[name]["costs"]["flops_per_token"])])
        first = next(iter(bench.values()), {})
        md = (f"Every arm's training step timed side by side in this process: {len(first.get('rounds', []))} rounds, "
              f"each timing {first.get('steps', 0)} steps of every arm in turn, {first.get('threads')} torch "
              "thread(s); the median over rounds. The arms see the same machine load, so their ratios mean something "
              "even on a shared machine (the runs' own tokens/s do not).\n\n"
              + table(["arm", "tokens/s (median over rounds)", "range over rounds", "relative to reference",
                       "train FLOPs/token"], rows))
        return Section(self.title, md, [], {"arms": data})
