"""The training loop: one :class:`Trainer` per run, driven by a recipe.

Shape legend: B micro batch, S sequence length, V vocabulary, A gradient-accumulation steps,
W data-parallel world size.

A step reads A micro batches of B windows on each of W ranks (``TokenBatches``: the batch depends
only on seed, step, micro and rank), back-propagates, clips, checks that loss and gradient norm are
finite, then updates. How the launch back-propagates, clips, updates and checkpoints its optimizer
(one process, DDP, DeepSpeed ZeRO, expert parallelism) is its backend's business
(:mod:`archlab.train.backends`); this loop is the same for all. The learning rate is a function of
the step. Together with the checkpointed weights, optimizer and RNG state, this makes a resumed run
repeat an uninterrupted one exactly on CPU.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

import archlab
from archlab.config.validate import RecipeError
from archlab.costs.peak import peak_flops
from archlab.model.checkpointing import allow_compiled_recomputation
from archlab.nn.moe import start_step, start_trace, stop_trace, take_trace
from archlab.nn.positions import position_class
from archlab.objectives import Loss, Objective, objective_for
from archlab.train import checkpoint as ckpt
from archlab.train import console, trackers
from archlab.train.backends import Backend, select_backend
from archlab.train.dist import (
    DistInfo,
    all_reduce_max,
    all_reduce_sum,
    barrier,
    broadcast_object,
    dist_info,
    main_process_first,
    teardown_at_exit,
)
from archlab.train.faults import NonFiniteError, StopSignal
from archlab.train.optim import lr_at, set_lr
from archlab.train.parallel import make_accelerator, resolve_precision
from archlab.train.router_trace import RouterTracer, tracer_for
from archlab.train.run_folder import (
    METRICS,
    RESUME_CHANGES,
    ROUTING,
    SUMMARY,
    TOKENIZER,
    MetricsLog,
    check_resume_changes,
    copy_jsonl_rows,
    mark_run,
    plot_losses,
    resolve_run,
    run_role,
    truncate_jsonl,
    write_env,
)


def flops_per_token(cfg: DictConfig) -> tuple[float, str]:
    """Training matmul FLOPs per token, and where the figure comes from."""
    try:
        from archlab.costs import training_flops_per_token
    except ImportError:  # temporary fallback: Kaplan's 6N + 6 L S D
        m = cfg.model
        n = archlab.num_params(cfg)
        return 6.0 * n + 6.0 * m.n_layers * cfg.train.seq_len * m.d_model, "fallback 6N + 6*L*S*D"
    return float(training_flops_per_token(archlab.model_config(cfg), cfg.train.seq_len, str(cfg.train.objective))), \
        "archlab.costs.training_flops_per_token"


class _Window:
    """Tokens/s and mean loss over the steps since the last log row, excluding eval/checkpoint time."""

    def __init__(self) -> None:
        self.t0, self.tokens, self.losses = time.perf_counter(), 0, []

    def add(self, tokens: int, loss: float) -> None:
        self.tokens += tokens
        self.losses.append(loss)

    def pause(self, seconds: float) -> None:
        self.t0 += seconds

    def take(self) -> tuple[float, float]:
        dt = time.perf_counter() - self.t0
        out = (self.tokens / dt if dt > 0 else float("nan"), sum(self.losses) / max(1, len(self.losses)))
        self.t0, self.tokens, self.losses = time.perf_counter(), 0, []
        return out


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
        with main_process_first(self.info):  # rank 0 builds the data cache, saying what it builds
            self.data = self.objective.prepare_data(cfg, progress=self.log)
        self.log(console.data_line(self.data))
        # train.router_trace_every: the main process traces the routing of sampled tokens (off by default)
        self.tracer: Optional[RouterTracer] = tracer_for(self.run_dir, t, self.info.is_main, cfg.model.moe is not None)
        self._trace: Optional[tuple] = None  # (trace, token ids, seconds) of this step, written after it

        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = self.objective.build_model(cfg)  # the plain module; the wrapped one is self.model_t
        self.model.checkpointing = t.activation_checkpointing  # how its blocks keep activations for backward
        self.step, self.tokens, self.elapsed_before = 0, 0, 0.0
        self.branch: Optional[dict] = None  # train.branch_from: {"from": parent checkpoint, "step": branch step}
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
            self._init_run_folder(resume_from)
        self.last_ckpt: Optional[Path] = resume_from
        self._routing_read_at = self.step  # where the routing statistics' current window starts
        if self.tracer is not None:  # a resumed run traces the steps after its checkpoint again
            self.tracer.start(self.step)
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

    def close(self) -> None:
        """Let go of the run's engine, wrapped model and optimizer (accelerate's ``free_memory``:
        a DeepSpeed engine's gradient hooks otherwise keep it, its ZeRO optimizer and every
        parameter's process-group handle alive until interpreter exit). Idempotent; the Trainer
        cannot train after it. ``archlab.train.train`` calls it; so should a script that drives a
        Trainer itself, before :func:`archlab.train.dist.shutdown_distributed`."""
        if self.metrics is not None:  # files closed, trackers finished (already done at the end of run)
            self.metrics.close()
        self.accelerator.free_memory()
        self.backend.close()

    def log(self, msg: str) -> None:
        if self.info.is_main:
            print(f"[archlab] {msg}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ the loop

    def run(self) -> dict[str, Any]:
        """Train to ``train.max_steps`` (or a stop signal); return the summary."""
        from tqdm.auto import tqdm

        t = self.cfg.train
        stop = StopSignal(announce=self.info.is_main)  # every rank gets the signal, rank 0 says so
        for line in console.start_block(self, self.origin):  # what runs, how big, where it writes
            self.log(line)
        self._start = time.perf_counter()
        bar = tqdm(total=t.max_steps, initial=self.step, disable=not self.info.is_main, desc=self.cfg.name,
                   unit="step", dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
        self._window = _Window()
        self._bar = console.BarFields(self.objective.eval_loss_key)
        self._routing_read_at = self.step  # routing statistics count from here
        status, message = "failed", ""
        ckpt_steps = set(t.ckpt_steps)
        try:
            while self.step < t.max_steps:
                self._one_step(bar)
                if bool(all_reduce_sum(torch.tensor([float(stop.requested)])) > 0):  # every rank stops together
                    status, message = "interrupted", f"stopped by {stop.received or 'a signal on another rank'}"
                    break
                self._periodic(eval_now=self.step % t.eval_every == 0,
                               ckpt_now=self.step % t.ckpt_every == 0 or self.step in ckpt_steps)
            else:
                status = "completed"
                for mult in t.eval_context_multipliers:
                    self._write({**self.evaluate(mult), "final": True})
            self.save_checkpoint(self.elapsed())
        except NonFiniteError as e:
            status, message = "nonfinite", str(e)
            raise
        except BaseException as e:
            message = f"{type(e).__name__}: {e}"
            raise
        finally:
            bar.close()
            stop.close()
            summary = self._finish(status, message, self.elapsed())
        if status == "interrupted":
            self.log(f"interrupted at step {self.step}; checkpoint {self.last_ckpt}; continue with train.resume=auto")
        return summary

    def optimizer_step(self, read_routing: bool = False) -> dict[str, Any]:
        """One optimizer step as :meth:`run` takes it (and as ``analysis.throughput`` times it): this
        step's lr, forward and backward over the micro batches (:meth:`train_step`), then, when loss
        and gradient norm are finite, the clipped update, the step and token counts and the MoE
        bookkeeping (the aux-loss-free bias update; the routing statistics when ``read_routing``).
        A non-finite step leaves the weights and counts as they were (``updated`` False)."""
        lr = lr_at(self.step, self.cfg.train)
        set_lr(self.optimizer_t, lr)
        r = self.train_step()  # forward, backward, gradient norm
        r.update(lr=lr, updated=math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]), moe={})
        if not r["updated"]:
            self.backend.zero_grad()
            return r
        self.backend.step()  # clipped to train.grad_clip
        self.step += 1
        self.tokens += self.tokens_per_step
        r["moe"] = self._moe_after_step(read_routing)
        return r

    def _one_step(self, bar) -> None:
        """One optimizer step (or a skipped batch), its metrics row and the MoE bookkeeping."""
        t = self.cfg.train
        routing_next = (self.step + 1) % (t.routing_every or t.log_every) == 0
        log_next = (self.step + 1) % t.log_every == 0 or self.step + 1 == t.max_steps
        r = self.optimizer_step(read_routing=log_next or routing_next)
        lr = r["lr"]
        if not r["updated"]:
            if t.on_nonfinite == "stop":
                raise NonFiniteError(self._nonfinite_message(r["loss"], r["grad_norm"]))
            self.step += 1
            self.log(f"step {self.step}: non-finite loss/grad norm ({r['loss']}, {r['grad_norm']}): batch skipped")
            self._write({"kind": "skip", "step": self.step, "tokens": self.tokens,
                         **{k: r[k] for k in ("loss", "aux_loss", "grad_norm")}})
            self._write_trace(skipped=True)
            bar.update(1)
            return
        self._window.add(self.tokens_per_step, r["loss"])
        log_now, routing_now, moe = log_next, routing_next, r["moe"]
        if moe:  # the routing window: the steps since the previous read (routing record or metrics row)
            moe["moe/window_steps"] = self.step - self._routing_read_at
            self._routing_read_at = self.step
        self._write_trace()
        if moe and routing_now and self.metrics is not None:
            self.metrics.write_routing({"step": self.step, "tokens": self.tokens, **moe})
        if log_now:
            tok_s, loss_avg = self._window.take()
            row = {"kind": "train", "step": self.step, "tokens": self.tokens, "loss": r["loss"],
                   "loss_avg": loss_avg, "aux_loss": r["aux_loss"], **r["parts"], "lr": lr,
                   "grad_norm": r["grad_norm"],
                   "tokens_per_s": tok_s, "flops_per_token": self.flops_per_token,
                   "mfu": tok_s * self.flops_per_token / (self.peak_flops * self.info.world_size),
                   "elapsed_s": self.elapsed(), **moe}
            self._write(row)
            bar.set_postfix(self._bar.postfix(row), refresh=False)  # loss, lr, tokens/s, MFU, latest val loss
        bar.update(1)

    def train_step(self) -> dict[str, float]:
        """Forward/backward over the A micro batches of this step; returns the reduced numbers.

        Does not update the weights: :meth:`run` does, once it knows loss and grad norm are finite.
        """
        A = self.cfg.train.grad_accum
        lm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        aux_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        part_sums: dict[str, Tensor] = {}
        start_step(self.model)  # every rank, before the first micro-batch: global-batch balancing restarts its counts
        traced = self.tracer is not None and self.tracer.due(self.step + 1)
        for micro in range(A):
            x_BW = self.batches.get(self.step, micro).to(self.device)  # (B, S + the objective's ids ahead)
            if traced and micro == 0:
                inputs_BS = self.objective.split(x_BW, self.objective.window_ahead)[0]
                index_T = self.tracer.sample(self.step + 1, inputs_BS.numel())
                start_trace(self.model, index_T.to(self.device))
            with self.accelerator.accumulate(self.model_t):
                # which of the step's W*A micro batches this is (TokenBatches' order): seeds the objective's draws
                loss = self._forward_loss(x_BW, micro * self.info.world_size + self.info.rank)
                if traced and micro == 0:
                    stop_trace(self.model)  # the step's first forward only (not a recomputation, not micro 1...)
                    token_ids_T = inputs_BS.reshape(-1).index_select(0, index_T.to(x_BW.device))
                if not self.backend.backward(loss.total):  # a DeepSpeed engine would update inside it
                    raise NonFiniteError(self._nonfinite_message(float("nan"), float("nan")))
            lm_sum += loss.main.detach().double()
            aux_sum += loss.aux.detach().double()
            for name, value in loss.parts.items():
                part_sums[name] = part_sums.get(name, 0.0) + value.detach().double()
        if traced:
            t0 = time.perf_counter()
            trace = take_trace(self.model)  # to the host: the only synchronisation tracing adds
            self._trace = (trace, token_ids_T.cpu(), time.perf_counter() - t0) if trace is not None else None
        grad_norm = self.backend.clip_grad_norm()
        names = sorted(part_sums)
        reduced = all_reduce_sum(torch.stack([lm_sum / A, aux_sum / A] + [part_sums[k] / A for k in names]).cpu())
        W = self.info.world_size
        return {"loss": float(reduced[0]) / W, "aux_loss": float(reduced[1]) / W, "grad_norm": grad_norm,
                "parts": {k: float(v) / W for k, v in zip(names, reduced[2:])}}  # the objective's other terms

    def _forward_loss(self, x_BW: Tensor, micro: int = 0) -> Loss:
        """The objective's loss of one micro batch through the wrapped model (``train.objective``: causal
        LM's LM head and cross-entropy run fused, without materialising the (B, S, V) logits). ``micro``:
        the micro batch's number within the step over all ranks."""
        with self.accelerator.autocast():
            return self.objective.loss(self.model_t, x_BW, step=self.step, micro=micro)

    def _nonfinite_message(self, loss: float, grad_norm: float) -> str:
        keep = f"the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else "no checkpoint was written yet"
        return (f"non-finite numbers at step {self.step + 1} (loss={loss}, grad_norm={grad_norm}): stopped before "
                f"updating the weights; {keep}. Lower train.lr, check the data, or set train.on_nonfinite=skip")

    def _moe_after_step(self, log_now: bool) -> dict[str, Any]:
        from archlab.nn.moe import balance_step, moe_layers, routing_stats

        if not moe_layers(self.model):
            return {}
        balance_step(self.model, all_reduce_sum)
        if not log_now:
            return {}
        check_local_routing(self.model, self.info.rank)
        return routing_stats(self.model, all_reduce_sum)

    def _write_trace(self, skipped: bool = False) -> None:
        """Write the router trace taken during this step (train.router_trace_every), if any."""
        if self._trace is None:
            return
        trace, token_ids, seconds = self._trace
        self._trace = None
        self.tracer.write(self.step, trace, token_ids, self.cfg.train.seq_len, seconds, skipped)

    def _write(self, row: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(row)

    def _periodic(self, eval_now: bool, ckpt_now: bool) -> None:
        """Validation and checkpoint between steps (not at the last step: the end of run does both)."""
        if self.step >= self.cfg.train.max_steps:
            return
        t0 = time.perf_counter()
        if eval_now:
            row = self.evaluate(1)
            self._bar.saw(row)
            self._write(row)
        if ckpt_now:
            self.save_checkpoint(self.elapsed())
        self._window.pause(time.perf_counter() - t0)

    def elapsed(self) -> float:
        """Training wall time of the whole run, across resumes."""
        return self.elapsed_before + time.perf_counter() - self._start

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, multiplier: int = 1) -> dict[str, Any]:
        """Validation loss at context ``multiplier * seq_len``: the objective's sums (``eval_keys``: token-loss
        sums and counts) all-reduced, then its row (``eval_row``: causal LM's ``loss``, masked LM's ``mlm_loss``)."""
        from archlab.data import DataError

        t, m = self.cfg.train, self.cfg.model
        S = t.seq_len * multiplier
        row: dict[str, Any] = {"kind": "val", "step": self.step, "tokens": self.tokens, "context_len": S,
                               "context_multiplier": multiplier}
        limit = position_class(m).max_length(m)
        if limit is not None and S > limit:
            return {**row, "skipped": f"{m.position.type} positions end at {limit} (model.max_seq_len={m.max_seq_len})"}
        B = max(1, t.micro_batch_size // multiplier)  # about the same tokens per batch at every length
        try:
            windows = self.objective.eval_batches(self.data, S, B, t.eval_batches, self.info.rank, self.info.world_size)
        except DataError as e:
            return {**row, "skipped": str(e)}
        keys = self.objective.eval_keys
        sums = torch.zeros(len(keys), dtype=torch.float64)
        windows = list(windows)
        # where each forward is a collective (tokens exchanged between ranks, partitioned parameters
        # gathered), every rank runs as many forwards as the busiest one; the extra ones (a window of
        # zeros) count nothing
        collective = self.backend.collective_forward
        n_forwards = int(all_reduce_max(torch.tensor(float(len(windows))))) if collective else len(windows)
        net = self.backend.eval_module(self.model)  # the model, or the engine where it gathers the parameters
        self.model.eval()
        for i in range(n_forwards):
            x_BS1 = (windows[i] if i < len(windows) else torch.zeros(1, S + 1, dtype=torch.long)).to(self.device)
            with self.accelerator.autocast():  # index: the window batch's number over all ranks
                parts = self.objective.eval_sums(net, x_BS1, index=i * self.info.world_size + self.info.rank)
            if i < len(windows):
                sums += torch.tensor([float(p) for p in parts], dtype=torch.float64)
        self.model.train()
        sums = all_reduce_sum(sums)
        return {**row, **self.objective.eval_row({k: float(v) for k, v in zip(keys, sums)})}

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, elapsed: float) -> Path:
        """Write a checkpoint of the current step atomically (collective: every rank calls it)."""
        run = self.run_dir
        if self.info.is_main:
            ckpt.begin(run, self.step)
        barrier()
        tmp = ckpt.tmp_dir(run, self.step)
        ckpt.save_rng(tmp, self.info.rank)
        weights = self.backend.save(tmp, self.model)  # its optimizer files; the full weights for rank 0
        if self.info.is_main:
            ckpt.save_model_weights(weights, tmp / ckpt.WEIGHTS)
            t = self.cfg.train
            ckpt.write_json_atomic(tmp / ckpt.STATE, {
                "step": self.step, "tokens": self.tokens, "elapsed_s": elapsed, "world_size": self.info.world_size,
                "global_batch": t.micro_batch_size * t.grad_accum * self.info.world_size,
                **self.backend.checkpoint_fields(),  # deepspeed, zero_stage, ep_size
                "archlab_version": archlab.__version__,
                "branch": self.branch})
            ckpt.save_recipe(self.cfg, tmp / ckpt.RECIPE)
        barrier()
        final = ckpt.tmp_dir(run, self.step).with_name(ckpt.step_dir_name(self.step))
        if self.info.is_main:
            ckpt.finish(run, self.step, self.cfg.train.keep_last, keep_steps=self.cfg.train.ckpt_steps)
        barrier()
        self.last_ckpt = final
        return final

    def _load_checkpoint(self, ckpt_dir: Path) -> Optional[Path]:
        """Load weights, step and tokens; return ``ckpt_dir`` when the backend restores its optimizer
        state from it as well, None when that restarts (another ep_size: logged as a warning)."""
        state = ckpt.load_state(ckpt_dir)
        ckpt.load_weights_into(self.model, ckpt_dir)
        restarts = self.backend.check_resume(ckpt_dir, state)
        if restarts is not None:
            self.log(f"warning: {restarts}")
        self.step, self.tokens = int(state["step"]), int(state["tokens"])
        self.elapsed_before = float(state.get("elapsed_s", 0.0))
        starts_branch = self._starts_branch(ckpt_dir)
        if self.cfg.train.branch_from is not None:  # a new branch starts here, or a branch resumes
            self.branch = {"from": str(ckpt_dir), "step": self.step} if starts_branch else state.get("branch")
        t = self.cfg.train
        batch_now = t.micro_batch_size * t.grad_accum * self.info.world_size
        if state.get("global_batch") not in (None, batch_now):
            self.log(f"warning: checkpoint was trained with a global batch of {state['global_batch']} windows, "
                     f"this launch uses {batch_now}: the data order differs from an uninterrupted run")
        if starts_branch:
            self.log(f"branching from {ckpt_dir} (step {self.step}, {self.tokens} tokens) into {self.run_dir}")
        else:
            self.log(f"resuming from {ckpt_dir} (step {self.step})")
        return None if restarts is not None else ckpt_dir

    def _starts_branch(self, ckpt_dir: Optional[Path]) -> bool:
        """Whether ``ckpt_dir`` belongs to another run folder: this run branches from it now."""
        return ckpt_dir is not None and Path(ckpt_dir).resolve().parent.parent != self.run_dir.resolve()

    # ------------------------------------------------------------------ run folder

    def _resolve_run(self) -> tuple[Path, Optional[Path], list[str]]:
        """(run folder, checkpoint to resume from or None, messages), decided on rank 0."""
        result: Any = None
        if self.info.is_main:
            try:
                run, found, notes = resolve_run(self.cfg)
                changes = []
                if found is not None and Path(found).resolve().parent.parent == run.resolve():  # not a new branch
                    # train.resume_allow_changes: the differences accepted; without it a difference is refused
                    changes = check_resume_changes(self.cfg, found, self.info.world_size)
                if changes:
                    notes = [*notes, "resume: train.resume_allow_changes=true: continuing with changed train "
                             "settings: " + "; ".join(f"{c['key']} {c['checkpoint']!r} -> {c['run']!r}"
                                                      for c in changes)]
                result = ("ok", run, found, notes, changes)
            except (RecipeError, ckpt.CheckpointError) as e:
                result = ("error", type(e).__name__, str(e))
        result = broadcast_object(result)
        if result[0] == "error":
            raise (ckpt.CheckpointError if result[1] == "CheckpointError" else RecipeError)(result[2])
        self.resume_changes: list[dict[str, Any]] = result[4]
        return result[1], result[2], result[3]

    def _init_run_folder(self, resume_from: Optional[Path]) -> None:
        run = self.run_dir
        mark_run(run, self.cfg.name)
        ckpt.save_recipe(self.cfg, run / ckpt.RECIPE)
        self.data.tokenizer.save(run / TOKENIZER)
        if self._starts_branch(resume_from):  # the branch's logs start with its parent's, up to the branch step
            for name in (METRICS, ROUTING):
                copy_jsonl_rows(resume_from.parent.parent / name, run / name, self.step)
        elif resume_from is not None:
            truncate_jsonl(run / METRICS, self.step)
            truncate_jsonl(run / ROUTING, self.step)
            truncate_jsonl(run / RESUME_CHANGES, self.step - 1)  # a resume at this step again replaces its row
            if self.resume_changes:  # accepted under train.resume_allow_changes: recorded with the run
                with open(run / RESUME_CHANGES, "a") as f:
                    f.write(json.dumps({"step": self.step, "checkpoint": str(resume_from), "time": time.time(),
                                        "changes": self.resume_changes}) + "\n")
        from archlab.data import unigram_entropy

        self.unigram_entropy = unigram_entropy(self.data.train)
        write_env(run, {
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "world_size": self.info.world_size,
            "accelerate_distributed_type": str(self.accelerator.distributed_type),
            "accelerate_num_processes": self.accelerator.num_processes,
            **self.backend.describe(),  # backend, deepspeed_config
            "mixed_precision": resolve_precision(self.cfg.train.precision),
            "torch_threads": torch.get_num_threads(),
            "n_params": archlab.num_params(self.cfg),
            "flops_per_token": self.flops_per_token,
            "flops_per_token_source": self.flops_source,
            "peak_flops": self.peak_flops,
            "peak_flops_source": self.peak_source,
            "mfu_definition": "tokens/s * flops_per_token / (peak_flops * world_size)",
            "tokens_per_step": self.tokens_per_step,
            "warmup_capped_from": self.cfg.train.warmup_capped_from,  # the recipe's warmup, longer than the run
            "data_cache": str(self.data.cache_path),
            "data_meta": self.data.meta,
            "unigram_entropy_train": self.unigram_entropy,
            "resumed_from": str(resume_from) if resume_from else None,
            "resume_changes": self.resume_changes,  # the train settings this launch changed (resume_allow_changes)
            "branch_from": self.branch["from"] if self.branch else None,
            "branch_step": self.branch["step"] if self.branch else None,
        })
        trackers.start(self.accelerator, run, self.cfg)  # train.trackers: run name = the folder's, recipe as hparams
        self.metrics = MetricsLog(run, self.accelerator)

    def _role(self) -> dict[str, Any]:
        """What kind of scaling point the run is. ``role``: ``stable`` (constant lr to the end, e.g. the
        trunk of WSD cooldowns: its final loss is not that of a finished schedule), ``cooldown`` (a
        decaying run branched from another run's checkpoint: it stands for a run of ``tokens`` tokens,
        the parent's included) or ``full`` (a whole schedule from step 0)."""
        t = self.cfg.train
        role = run_role(t, branched=bool(self.branch))
        return {"role": role, "branch_from": self.branch["from"] if self.branch else None,
                "branch_step": self.branch["step"] if self.branch else None}

    def _finish(self, status: str, message: str, elapsed: float) -> dict[str, Any]:
        summary: dict[str, Any] = {"status": status, "message": message, "step": self.step, "tokens": self.tokens,
                                   "run_dir": str(self.run_dir), **self._role(),
                                   "last_checkpoint": str(self.last_ckpt) if self.last_ckpt else None,
                                   "elapsed_s": elapsed, "rank": self.info.rank}
        if not self.info.is_main:
            return summary
        from archlab.train.run_folder import read_jsonl

        rows = read_jsonl(self.run_dir / METRICS)
        train = [r for r in rows if r.get("kind") == "train"]
        final_val = [r for r in rows if r.get("kind") == "val" and r.get("final")]
        summary.update({
            "final_train_loss": train[-1]["loss"] if train else None,
            "final_val_loss": {str(r["context_len"]): r.get("loss") for r in final_val if "loss" in r},
            # another objective's own loss (masked LM: mlm_loss; span corruption: span_loss), never under "loss"
            **({f"final_val_{key}": {str(r["context_len"]): r[key] for r in final_val if key in r}}
               if (key := self.objective.eval_loss_key) != "loss" and any(key in r for r in final_val) else {}),
            "final_val_skipped": {str(r["context_len"]): r["skipped"] for r in final_val if "skipped" in r},
            "unigram_entropy_train": self.unigram_entropy,
            "mean_tokens_per_s": (sum(r["tokens_per_s"] for r in train) / len(train)) if train else None,
            "mean_mfu": (sum(r["mfu"] for r in train) / len(train)) if train else None,
            "flops_per_token": self.flops_per_token,
            "training_flops": self.flops_per_token * self.tokens,
            "n_params": archlab.num_params(self.cfg),
            # every resume that changed train settings (train.resume_allow_changes), oldest first
            "resume_changes": read_jsonl(self.run_dir / RESUME_CHANGES) if (self.run_dir / RESUME_CHANGES).is_file()
            else [],
        })
        try:
            ckpt.write_json_atomic(self.run_dir / SUMMARY, summary)
            if train:
                plot_losses(self.run_dir, self.cfg.name)
        finally:
            if self.metrics is not None:  # the trackers' runs end here too
                self.metrics.close()
        return summary


def check_local_routing(model, rank: int) -> None:
    """This rank's routing window (before the all-rank sum): kept slots per expert must add up to
    tokens * top_k - dropped slots. RuntimeError naming the layer and rank otherwise."""
    from archlab.nn.moe import moe_layers

    for i, layer in enumerate(moe_layers(model)):
        E, K, w = layer.stats.E, layer.stats.K, layer.stats.window  # [counts_E, tokens, dropped, ...]
        counts, tokens, dropped = float(w[:E].sum()), float(w[E]), float(w[E + 1])
        if round(counts) != round(tokens * K - dropped):
            raise RuntimeError(f"routing bookkeeping broken on rank {rank}, MoE layer {i}: sum(counts)={counts} "
                               f"but tokens*K - dropped = {tokens * K - dropped}")


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
