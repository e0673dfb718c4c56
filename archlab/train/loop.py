"""The training loop: one :class:`Trainer` per run, driven by a recipe.

Shape legend: B micro batch, S sequence length, V vocabulary, A gradient-accumulation steps,
W data-parallel world size.

A step reads A micro batches of B windows on each of W ranks (``TokenBatches``: the batch depends
only on seed, step, micro and rank), back-propagates, clips, checks that loss and gradient norm are
finite, then updates. How the launch back-propagates, clips, updates and checkpoints its optimizer
(one process, DDP, DeepSpeed ZeRO, expert parallelism) is its backend's business
(:mod:`archlab.train.backends`); this loop is the same for all. The learning rate is a function of
the step. Together with the checkpointed weights, optimizer and RNG state, this makes a resumed run
repeat an uninterrupted one exactly on CPU. Optional features (MoE bookkeeping, router tracing,
WSD branching, the non-finite policy, logging, trackers) are callbacks (:mod:`archlab.train.callbacks`:
the hooks and their order), chosen from the recipe once.
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

from archlab import trackers
from archlab.config.schema import model_config
from archlab.costs import training_flops_per_token
from archlab.costs.peak import peak_flops
from archlab.data import unigram_entropy
from archlab.data.corpus import DataError
from archlab.data.shards import open_shard, shard_files
from archlab.data.tokens import shard_counts
from archlab.model.checkpointing import allow_compiled_recomputation
from archlab.objectives import Loss, Objective, objective_for, objective_type
from archlab.train import checkpoint as ckpt
from archlab.train import console, record
from archlab.train.backends import Backend, select_backend
from archlab.train.callbacks import Callback, choose
from archlab.train.callbacks.branch import starts_branch
from archlab.train.callbacks.nonfinite import nonfinite_message
from archlab.train.checkpointer import load_checkpoint, save_checkpoint
from archlab.train.dist import DistInfo, all_reduce_sum, barrier, dist_info, main_process_first, teardown_at_exit
from archlab.train.evaluate import evaluate
from archlab.train.faults import NonFiniteError, StopSignal
from archlab.train.optim import lr_at, set_lr
from archlab.train.parallel import make_accelerator
from archlab.train.run_folder import MetricsLog
from archlab.train.upcycle import start_from


def count_shard_share(cfg: DictConfig, info: DistInfo) -> int:
    """``data.source=tokens`` under several processes: count this rank's share of the shards (every
    ``world_size``-th file) into the id-count cache (:func:`archlab.data.tokens.shard_counts`), before rank 0
    prepares the data while the others wait at a barrier: rank 0 then reads every count from the cache,
    and the ranks count together in about 1/world_size of the time. A shard that cannot be read is left to
    rank 0's preparation, which names it. Returns the number of shards counted afresh here."""
    if info.world_size == 1 or cfg.data.source != "tokens":
        return 0
    cache_dir = Path(os.path.expanduser(str(cfg.data.cache_dir))) / "token-counts"  # as prepare_tokens
    fresh = 0
    try:
        train, val = shard_files(cfg.data)
        for path in (train + val)[info.rank::info.world_size]:
            shard = open_shard(path, str(cfg.data.shard_format))
            fresh += not shard_counts(shard, shard.open(), cache_dir)[1]
    except DataError:
        pass
    return fresh


def flops_per_token(cfg: DictConfig) -> tuple[float, str]:
    """Training matmul FLOPs per token, and where the figure comes from."""
    flops = training_flops_per_token(model_config(cfg), cfg.train.seq_len, objective_type(cfg.train.objective))
    return float(flops), "archlab.costs.training_flops_per_token"


class Trainer:
    """Builds everything a run needs from a recipe, then :meth:`run` trains it."""

    def __init__(self, cfg: DictConfig, origin: Optional[str] = None):
        self.cfg = cfg
        self.origin = origin  # how the recipe was given (file + overrides), for the start block
        t = cfg.train
        tracker_names = trackers.requested(t)
        trackers.check_installed(tracker_names)  # a missing tracker package stops the run here, before anything
        self.accelerator = make_accelerator(t, tracker_names)
        self.info: DistInfo = dist_info(self.accelerator)
        if self.info.world_size > 1:
            teardown_at_exit()  # process groups destroyed before exit, also when a script drives the Trainer
        # how this launch trains (plain/DDP, ZeRO, expert parallel); refusals (e.g. MoE at ZeRO-3)
        # come here, before anything is built
        self.backend: Backend = select_backend(self.accelerator, self.info, cfg)
        self.device = self.accelerator.device
        # where the run writes and what it resumes, before the data is built: a refused resume says so at once
        self.run_dir, resume_from, notes = self._resolve_run()
        for note in notes:
            self.log(note)
        # train.objective: the run's data and model, the window each micro batch holds, its inputs and targets, the loss
        self.objective: Objective = objective_for(cfg)
        count_shard_share(cfg, self.info)  # token shards: every rank counts its share first, off the barrier
        with main_process_first(self.info):  # rank 0 builds the data cache, saying what it builds
            self.data = self.objective.prepare_data(cfg, progress=self.log)
        self.log(console.data_line(self.data))

        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = self.objective.build_model(cfg)  # the plain module; the wrapped one is self.model_t
        start_from(self.model, cfg, self.log)  # train.init_from of a causal LM: loaded, or upcycled to an MoE
        self.model.checkpointing = t.activation_checkpointing  # how its blocks keep activations for backward
        self.step, self.tokens, self.elapsed_before, self.paused_s = 0, 0, 0.0, 0.0
        self.stop: Optional[StopSignal] = None  # while run() trains: the signals it stops on
        self.branch: Optional[dict] = None  # train.branch_from: {"from": parent checkpoint, "step": branch step}
        self.callbacks: list[Callback] = choose(self)  # the optional features, in call order
        # full (consolidated) weights, before any sharding; the optimizer state too where the backend can
        restore_from = self._load_checkpoint(resume_from) if resume_from is not None else None
        self.backend.shard(self.model)
        self.optimizer = self.backend.build_optimizer(self.model, restore_from)
        if t.compile and t.activation_checkpointing != "none":
            allow_compiled_recomputation()  # routing statistics recorded once, as in eager
        module = torch.compile(self.model) if t.compile else self.model
        self.backend.prepare(self.model, module, self.optimizer, restore_from)
        torch.manual_seed(t.seed + 1000 * (self.info.rank + 1))  # dropout differs between ranks
        if resume_from is not None:
            ckpt.load_rng(resume_from, self.info.rank)
        self.batches = self.objective.train_batches(self.data, self.info.rank, self.info.world_size)
        self.tokens_per_step = self.batches.global_batch_size * t.seq_len
        self.flops_per_token, self.flops_source = flops_per_token(cfg)
        self.peak_flops, self.peak_source = peak_flops(cfg, self.device)
        self.metrics: Optional[MetricsLog] = None
        if self.info.is_main:
            self.unigram_entropy = unigram_entropy(self.data.train)
            record.start_run_folder(self, resume_from, resumes_here=resume_from is not None
                                    and not starts_branch(self, resume_from))
            self.metrics = MetricsLog(self.run_dir)
        self.last_ckpt: Optional[Path] = resume_from
        self._hook("on_build")
        barrier()

    @property
    def model_t(self):
        """The wrapped model the training forward runs through (DDP, a DeepSpeed engine, or the model)."""
        return self.backend.model_t

    @property
    def optimizer_t(self):
        """The wrapped optimizer (the learning rate is set on it)."""
        return self.backend.optimizer_t

    @property
    def zero_stage(self) -> int:
        """The launch's DeepSpeed ZeRO stage (0 without DeepSpeed), for scripts that drive a Trainer."""
        return self.backend.launch.zero_stage

    def callback(self, kind: type) -> Optional[Callback]:
        """The run's callback of class ``kind``, or None when the recipe did not choose it."""
        return next((cb for cb in self.callbacks if isinstance(cb, kind)), None)

    def _hook(self, name: str, *args) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(self, *args)

    def close(self) -> None:
        """Let go of the run's engine, wrapped model and optimizer (accelerate's ``free_memory``:
        a DeepSpeed engine's gradient hooks otherwise keep it, its ZeRO optimizer and every
        parameter's process-group handle alive until interpreter exit). Idempotent; the Trainer
        cannot train after it. ``archlab.train.train`` calls it; so should a script that drives a
        Trainer itself, before :func:`archlab.train.dist.shutdown_distributed`."""
        if self.metrics is not None:  # files closed (already done at the end of run)
            self.metrics.close()
        self._hook("on_close")
        self.accelerator.free_memory()
        self.backend.close()

    def log(self, msg: str) -> None:
        if self.info.is_main:
            print(f"[archlab] {msg}", file=sys.stderr, flush=True)

    def write(self, row: dict[str, Any]) -> None:
        """Append a row to metrics.jsonl (main process) and hand it to the callbacks."""
        if self.metrics is not None:
            self.metrics.write(row)
            self._hook("on_row", row)

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        """Train to ``train.max_steps`` (or a stop signal); return the summary."""
        t = self.cfg.train
        stop = StopSignal(announce=self.info.is_main)  # every rank gets the signal, rank 0 says so
        for line in console.start_block(self, self.origin):  # what runs, how big, where it writes
            self.log(line)
        self._start = time.perf_counter()
        self._hook("on_start")
        status, message = "failed", ""
        ckpt_steps = set(t.ckpt_steps)
        self.stop = stop
        try:
            while self.step < t.max_steps:
                r = self.run_step()
                # every rank stops together: several processes agree through the step's own reduction (a
                # signal that arrives after it stops the next step), one process reads its flag now
                if r.get("stop") if self.info.world_size > 1 else stop.requested:
                    status, message = "interrupted", f"stopped by {stop.received or 'a signal on another rank'}"
                    break
                self._periodic(eval_now=self.step % t.eval_every == 0,
                               ckpt_now=self.step % t.ckpt_every == 0 or self.step in ckpt_steps)
            else:
                status = "completed"
                for mult in t.eval_context_multipliers:
                    self._eval_row({**self.evaluate(mult), "final": True})
            self.save_checkpoint(self.elapsed())
        except NonFiniteError as e:
            status, message = "nonfinite", str(e)
            raise
        except BaseException as e:
            message = f"{type(e).__name__}: {e}"
            raise
        finally:
            stop.close()
            self.stop = None
            self._hook("on_end", status)
            summary = self._finish(status, message, self.elapsed())
        if status == "interrupted":
            self.log(f"interrupted at step {self.step}; checkpoint {self.last_ckpt}; continue with train.resume=auto")
        return summary

    def run_step(self) -> dict[str, Any]:
        """One step as :meth:`run` takes it: :meth:`optimizer_step`, reading windowed statistics where a
        callback asks, then every callback's ``after_step`` (the policy for a non-finite step, the rows)."""
        r = self.optimizer_step(read_stats=any(cb.reads_stats(self, self.step + 1) for cb in self.callbacks))
        self._hook("after_step", r)
        return r

    def optimizer_step(self, read_stats: bool = False) -> dict[str, Any]:
        """One optimizer step (as ``analysis.measurements.throughput`` times it): this step's lr, forward and backward
        over the micro batches (:meth:`train_step`), then, when loss and gradient norm are finite, the
        clipped update, the step and token counts and the callbacks' ``after_update`` (MoE: the
        aux-loss-free bias; the routing statistics when ``read_stats``). A non-finite step leaves the
        weights and counts as they were (``updated`` False)."""
        lr = lr_at(self.step, self.cfg.train)
        set_lr(self.optimizer_t, lr)
        r = self.train_step()  # forward, backward, gradient norm
        r.update(lr=lr, updated=math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]), extra={})
        if not r["updated"]:
            self.backend.zero_grad()
            return r
        self.backend.step()  # clipped to train.grad_clip
        self.step += 1
        self.tokens += self.tokens_per_step
        self._hook("after_update", r, read_stats)
        return r

    def train_step(self) -> dict[str, Any]:
        """Forward/backward over the A micro batches of this step; returns the reduced numbers, and
        ``stop``: whether a stop signal reached any rank before the reduction.

        Does not update the weights: :meth:`run` does, once it knows loss and grad norm are finite.
        One collective and one host read per step: loss, aux loss, the objective's parts and the stop
        flag summed over the ranks in one all-reduce on the device, read back with the gradient norm.
        """
        A = self.cfg.train.grad_accum
        lm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        aux_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        part_sums: dict[str, Tensor] = {}
        self._hook("before_step")
        for micro in range(A):
            x_BW = self.batches.get(self.step, micro).to(self.device)  # (B, S + the objective's ids ahead)
            self._hook("before_forward", micro, x_BW)
            with self.accelerator.accumulate(self.model_t):
                # which of the step's W*A micro batches this is (TokenBatches' order): seeds the objective's draws
                loss = self._forward_loss(x_BW, micro * self.info.world_size + self.info.rank)
                self._hook("after_forward", micro, x_BW)
                if not self.backend.backward(loss.total):  # a DeepSpeed engine would update inside it
                    raise NonFiniteError(nonfinite_message(self, float("nan"), float("nan")))
            lm_sum += loss.main.detach().double()
            aux_sum += loss.aux.detach().double()
            for name, value in loss.parts.items():
                part_sums[name] = part_sums.get(name, 0.0) + value.detach().double()
        self._hook("after_backward")
        grad_norm = self.backend.clip_grad_norm()  # a float, or a tensor read below with the rest
        names = sorted(part_sums)
        stop = lm_sum.new_full((), float(self.stop is not None and self.stop.requested))
        reduced = all_reduce_sum(torch.stack([lm_sum / A, aux_sum / A] + [part_sums[k] / A for k in names] + [stop]))
        norm = torch.as_tensor(grad_norm, dtype=reduced.dtype, device=reduced.device).reshape(1)
        values = torch.cat([reduced, norm]).tolist()  # the step's one host read
        W = self.info.world_size
        return {"loss": values[0] / W, "aux_loss": values[1] / W, "grad_norm": values[-1],
                "parts": {k: v / W for k, v in zip(names, values[2:-2])},  # the objective's other terms
                "stop": values[-2] > 0}

    def _forward_loss(self, x_BW: Tensor, micro: int = 0) -> Loss:
        """The objective's loss of one micro batch through the wrapped model (``train.objective``: causal
        LM's LM head and cross-entropy run fused, without materialising the (B, S, V) logits). ``micro``:
        the micro batch's number within the step over all ranks."""
        with self.accelerator.autocast():
            return self.objective.loss(self.model_t, x_BW, step=self.step, micro=micro)

    def _periodic(self, eval_now: bool, ckpt_now: bool) -> None:
        """Validation and checkpoint between steps (not at the last step: the end of run does both)."""
        if self.step >= self.cfg.train.max_steps:
            return
        t0 = time.perf_counter()
        if eval_now:
            self._eval_row(self.evaluate(1))
        if ckpt_now:
            self.save_checkpoint(self.elapsed())
        self.paused_s += time.perf_counter() - t0  # left out of the logged tokens/s

    def _eval_row(self, row: dict[str, Any]) -> None:
        self.write(row)
        self._hook("on_eval", row)

    def elapsed(self) -> float:
        """Training wall time of the whole run, across resumes."""
        return self.elapsed_before + time.perf_counter() - self._start

    def evaluate(self, multiplier: int = 1) -> dict[str, Any]:
        """The validation row at context ``multiplier * seq_len`` (:func:`archlab.train.evaluate.evaluate`)."""
        return evaluate(self, multiplier)

    # ------------------------------------------------------------------ checkpoints and the run folder

    def save_checkpoint(self, elapsed: float) -> Path:
        """Write a checkpoint of the current step atomically (collective: every rank calls it)."""
        self.last_ckpt = save_checkpoint(self, elapsed)
        return self.last_ckpt

    def _load_checkpoint(self, ckpt_dir: Path) -> Optional[Path]:
        """Load weights, step and tokens; return ``ckpt_dir`` when the backend restores its optimizer
        state from it as well, None when that restarts (another ep_size: logged as a warning)."""
        state, restore_from = load_checkpoint(self, ckpt_dir)
        self._hook("on_restore", ckpt_dir, state)  # a branch records its parent (WSD branching)
        if not starts_branch(self, ckpt_dir):
            self.log(f"resuming from {ckpt_dir} (step {self.step})")
        return restore_from

    def _resolve_run(self) -> tuple[Path, Optional[Path], list[str]]:
        """(run folder, checkpoint to resume from or None, messages), decided on rank 0."""
        run, found, notes, self.resume_changes = record.resolve(self.cfg, self.info)
        return run, found, notes

    def _finish(self, status: str, message: str, elapsed: float) -> dict[str, Any]:
        return record.summarize(self, status, message, elapsed)


def train(cfg: DictConfig, origin: Optional[str] = None) -> dict[str, Any]:
    """Train the recipe ``cfg`` (a loaded DictConfig) and return the run's summary.

    Raises RecipeError / DataError / CheckpointError for bad input and NonFiniteError when the
    loss or gradient stops being finite (train.on_nonfinite=stop).
    """
    trainer = Trainer(cfg, origin)
    try:
        return trainer.run()
    finally:
        trainer.close()
