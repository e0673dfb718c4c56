"""Instrumented training of one recipe, for the learned-positions investigation
(``docs/experiments/learned-positions.md``): the trainer's step (same data order, init, AdamW
groups, schedule and clipping as ``python -m archlab.train``), logging per step the loss and the
position table's and token embedding's statistics, and ending with the trainer's validation loss.

    python -m tools.position_probe recipes/llama/tiny.yaml model.position.type=learned \\
        model.max_seq_len=128 --steps 300 --out /tmp/lp/learned.jsonl

Ablations (each applied after the model's own init):
  --table-init zero|std=<s>   the learned table's init (default: the model's, N(0, init_std))
  --table-lr-scale f          the table in its own AdamW group at f x lr (its weight decay: --table-wd)
  --table-wd w                weight decay of the table (default 0, as archlab)
  --peer nanogpt              train ``tools.nanogpt.from_archlab(model)`` instead (dense recipes),
                              same weights and batches; --optim nanogpt: nanoGPT's configure_optimizers
                              groups (every >= 2-D tensor decayed, wte and wpe included)
Plot: ``python -m tools.position_probe plot OUT.png LABEL=RUN.jsonl ...``.
One line per step: {"step", "loss", "lr", "grad_norm", "table_rms", "table_row_norm", "table_grad_norm",
"table_update_ratio", "tok_row_norm", "used_tok_row_norm", ...}; the last line {"kind": "val", "loss"}.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch import nn

import archlab
from archlab.data import TokenBatches, eval_windows
from archlab.nn.loss import lm_loss
from archlab.objectives import token_data
from archlab.train.optim import lr_at, param_groups
from tools.nanogpt import from_archlab


def _groups(model: nn.Module, table: nn.Parameter | None, args, weight_decay: float) -> list[dict]:
    if args.optim == "nanogpt":  # karpathy/nanoGPT model.py configure_optimizers
        params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{k: v for k, v in g.items() if k not in ("lr_scale", "name")}
                  for g in param_groups(model, weight_decay)]
    for g in groups:
        g["lr_scale"] = 1.0
    if table is not None and (args.table_lr_scale != 1.0 or args.table_wd is not None):
        for g in groups:
            g["params"] = [p for p in g["params"] if p is not table]
        groups.append({"params": [table], "lr_scale": args.table_lr_scale,
                       "weight_decay": args.table_wd if args.table_wd is not None else 0.0})
    return [g for g in groups if g["params"]]


def plot(argv) -> None:
    """plot OUT.png LABEL=RUN.jsonl ...: training loss (mean of 10 steps) and, for runs with a table,
    the mean row norm of the table and of the token embedding rows in the batch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, runs = argv[0], [a.split("=", 1) for a in argv[1:]]
    fig, (ax_loss, ax_norm) = plt.subplots(1, 2, figsize=(15, 4.8))
    for label, path in runs:
        rows = [json.loads(line) for line in open(path)]
        steps = [r for r in rows if "step" in r]
        k = 10
        xs = [steps[i + k - 1]["step"] for i in range(0, len(steps) - k + 1, k)]
        ys = [sum(r["loss"] for r in steps[i:i + k]) / k for i in range(0, len(steps) - k + 1, k)]
        val = [r["loss"] for r in rows if r.get("kind") == "val"]
        line, = ax_loss.plot(xs, ys, label=f"{label} (val {val[0]:.2f})" if val else label)
        if steps[0].get("table_row_norm") is not None:
            ax_norm.plot([r["step"] for r in steps], [r["table_row_norm"] for r in steps], color=line.get_color(),
                         label=f"{label}: position row")
            ax_norm.plot([r["step"] for r in steps], [r["used_tok_row_norm"] for r in steps], color=line.get_color(),
                         linestyle=":", label=f"{label}: token row")
    ax_loss.set(xlabel="optimizer step", ylabel="training loss (nats/token, mean of 10 steps)",
                title="Training loss (legend: final validation loss)")
    ax_norm.set(xlabel="optimizer step", ylabel="mean L2 norm of a row",
                title="Position-table rows vs token-embedding rows")
    ax_loss.legend(fontsize=7)
    ax_norm.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (ax_loss, ax_norm):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("recipe")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's train.max_steps")
    ap.add_argument("--stop-at", type=int, default=None,
                    help="stop after this many steps of the --steps schedule (no validation loss)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--table-init", default=None)
    ap.add_argument("--table-lr-scale", type=float, default=1.0)
    ap.add_argument("--table-wd", type=float, default=None)
    ap.add_argument("--peer", choices=["archlab", "nanogpt"], default="archlab")
    ap.add_argument("--optim", choices=["archlab", "nanogpt"], default="archlab")
    ap.add_argument("--save", default=None, help="torch.save the final table, initial table and token embedding here")
    args = ap.parse_args(argv)

    cfg = archlab.load_recipe(args.recipe, args.overrides)
    t = cfg.train
    if args.steps is not None:
        t.max_steps = args.steps
    data = token_data(cfg)
    torch.manual_seed(t.seed)  # as the trainer: the initial weights
    model = archlab.build_model(cfg)
    table = model.positions.table.weight if hasattr(model.positions, "table") else None
    with torch.no_grad():
        if table is not None and args.table_init == "zero":
            table.zero_()
        elif table is not None and args.table_init and args.table_init.startswith("std="):
            table.normal_(0.0, float(args.table_init[4:]))
    net = model
    tok = model.embed.weight
    if args.peer == "nanogpt":
        net = from_archlab(model)
        table, tok = net.transformer.wpe.weight, net.transformer.wte.weight
    groups = _groups(net, table, args, t.weight_decay)
    opt = torch.optim.AdamW(groups, lr=t.lr, betas=tuple(float(b) for b in t.betas), eps=t.eps, foreach=False)
    torch.manual_seed(t.seed + 1000)  # as the trainer (rank 0): dropout
    batches = TokenBatches(data.train, t.seq_len, t.micro_batch_size, t.grad_accum, 0, 1, t.seed)
    S = t.seq_len

    def forward_loss(x_BS1):
        if args.peer == "nanogpt":
            return net(x_BS1[:, :-1].contiguous(), x_BS1[:, 1:].contiguous())[1]
        return net(x_BS1[:, :-1], targets=x_BS1[:, 1:]).loss

    def table_stats(prefix=""):
        if table is None:
            return {}
        used = table.detach()[:S]
        return {"table_rms": float(used.pow(2).mean().sqrt()), "table_row_norm": float(used.norm(dim=1).mean()),
                "table_unused_row_norm": float(table.detach()[S:].norm(dim=1).mean()) if table.shape[0] > S
                else None,
                "table_mean_row_norm": float(used.mean(0).norm()),  # the part shared by every position
                # how much of the initial draw is left (1: unchanged; nan for a zero init)
                "table_init_cos": float((used * table0[:S]).sum() / (used.norm() * table0[:S].norm()))
                if float(table0[:S].norm()) > 0 else None,
                # smoothness: mean cosine of neighbouring rows (a random table: ~0)
                "table_adjacent_cos": float(torch.nn.functional.cosine_similarity(used[1:], used[:-1], dim=1).mean())
                if float(used.norm()) > 0 else None}

    table0 = table.detach().clone() if table is not None else None
    t0 = time.time()
    with open(args.out, "w") as f:
        f.write(json.dumps({"kind": "init", "args": vars(args), **table_stats(),
                            "tok_row_norm": float(tok.detach().norm(dim=1).mean())}) + "\n")
        for step in range(args.stop_at or t.max_steps):
            lr = lr_at(step, t)
            for g in opt.param_groups:
                g["lr"] = lr * g["lr_scale"]
            seen = torch.zeros(tok.shape[0], dtype=torch.bool)
            loss_sum = 0.0
            for micro in range(t.grad_accum):
                x = batches.get(step, micro)
                seen[x[:, :-1].flatten()] = True
                loss = forward_loss(x) / t.grad_accum
                loss.backward()
                loss_sum += float(loss.detach())
            gn = float(torch.nn.utils.clip_grad_norm_(net.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf))
            row = {"step": step + 1, "loss": loss_sum, "lr": lr, "grad_norm": gn}
            if table is not None:
                before = table.detach().clone()
                row["table_grad_norm"] = float(table.grad.norm())  # after clipping: what AdamW sees
                row["table_grad_share"] = row["table_grad_norm"] / max(gn, 1e-12) if gn <= t.grad_clip else \
                    row["table_grad_norm"] / t.grad_clip
            tok_before = tok.detach()[seen].clone()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if table is not None:
                row["table_update_ratio"] = float((table.detach() - before).norm() / before.norm().clamp_min(1e-12))
                row.update(table_stats())
            row["tok_row_norm"] = float(tok.detach().norm(dim=1).mean())
            row["used_tok_row_norm"] = float(tok.detach()[seen].norm(dim=1).mean())
            row["tok_update_ratio"] = float((tok.detach()[seen] - tok_before).norm() / tok_before.norm())
            f.write(json.dumps(row) + "\n")
            if (step + 1) % 50 == 0:
                print(f"step {step + 1} loss {loss_sum:.3f} " + " ".join(
                    f"{k}={row[k]:.3g}" for k in ("table_row_norm", "used_tok_row_norm", "table_update_ratio")
                    if row.get(k) is not None), flush=True)
        if args.stop_at:
            return
        net.eval()
        sums = [0.0, 0]
        with torch.no_grad():
            for x in eval_windows(data.val, S, t.micro_batch_size, t.eval_batches):
                inputs = x[:, :-1].contiguous()
                logits = net(inputs).logits if args.peer == "archlab" else net(inputs, x[:, 1:].contiguous())[0]
                sums[0] += float(lm_loss(logits, x[:, 1:], reduction="sum"))
                sums[1] += x[:, 1:].numel()
        val = sums[0] / sums[1]
        f.write(json.dumps({"kind": "val", "loss": val, "train_s": time.time() - t0}) + "\n")
    if args.save:
        torch.save({"table": table.detach() if table is not None else None, "table0": table0,
                    "tok": tok.detach()}, args.save)
    print(f"final validation loss {val:.4f} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)  # a diagnostic beside other jobs: one core
    if sys.argv[1:2] == ["plot"]:
        plot(sys.argv[2:])
    else:
        main()
