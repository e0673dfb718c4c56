"""The training loop: one :class:`Trainer` per run, driven by a recipe.

Shape legend: B micro batch, S sequence length, V vocabulary, A gradient-accumulation steps,
W data-parallel world size.

A step reads A micro batches of B windows on each of W ranks (``TokenBatches``: the batch depends
only on seed, step, micro and rank), back-propagates through accelerate (DDP or a DeepSpeed
engine, as launched), clips, checks that loss and gradient norm are finite, then updates. The
learning rate is a function of the step. Together with the checkpointed weights, optimizer and
RNG state, this makes a resumed run repeat an uninterrupted one exactly on CPU.
"""

from __future__ import annotations

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
from archlab.model.build import build_model
from archlab.model.checkpointing import allow_compiled_recomputation
from archlab.nn.loss import lm_loss
from archlab.train import checkpoint as ckpt
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
from archlab.nn.moe import start_step
from archlab.nn.positions import position_class
from archlab.train.optim import build_optimizer, lr_at, set_lr
from archlab.train.parallel import (
    check_data_parallel,
    check_zero_stage,
    deepspeed_engine,
    fill_deepspeed_config,
    make_accelerator,
    resolve_precision,
    safe_deepspeed_load,
    uses_deepspeed,
    zero3_consolidated_state_dict,
    zero3_traceable_outputs,
)
from archlab.train.run_folder import (
    METRICS,
    ROUTING,
    SUMMARY,
    TOKENIZER,
    MetricsLog,
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
    return float(training_flops_per_token(archlab.model_config(cfg), cfg.train.seq_len)), \
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


def _rank_optimizer_state(ckpt_dir: Path, rank: int, zero: bool) -> dict:
    """An expert-parallel rank's optimizer file: a ZeRO-1/2 partition (``zero``) or a plain AdamW
    state (ZeRO stage 0); the other kind is refused, naming the stage to resume with."""
    from archlab.train.parallel import _deepspeed_safe_globals

    path = ckpt_dir / ckpt.rank_optimizer_name(rank)
    with torch.serialization.safe_globals(_deepspeed_safe_globals()):  # ZeRO's loss scaler, stage enum
        state = ckpt.load_optimizer_state(ckpt_dir, path.name)
    written_zero = "base_optimizer_state" in state
    if written_zero != zero:
        raise ckpt.CheckpointError(
            f"{path}: written at DeepSpeed ZeRO stage {'1-2' if written_zero else '0'}, this launch uses "
            f"{'1-2' if zero else '0'}: resume with the ZeRO stage the checkpoint was trained with")
    return state


class Trainer:
    """Builds everything a run needs from a recipe, then :meth:`run` trains it."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        t = cfg.train
        self.accelerator = make_accelerator(t)
        self.info: DistInfo = dist_info(self.accelerator)
        self.deepspeed = uses_deepspeed(self.accelerator)
        check_data_parallel(self.accelerator, self.info.world_size)
        if self.info.world_size > 1:
            teardown_at_exit()  # process groups destroyed before exit, also when a script drives the Trainer
        if self.deepspeed and t.on_nonfinite == "skip":
            raise RecipeError("train.on_nonfinite='skip' is not supported under DeepSpeed (the engine updates inside "
                              "backward); use train.on_nonfinite=stop or launch without DeepSpeed")
        check_zero_stage(self._zero_stage(), cfg)  # e.g. MoE at ZeRO-3: refused before anything is built
        self.device = self.accelerator.device
        from archlab.data import TokenBatches, prepare_data

        with main_process_first(self.info):
            self.data = prepare_data(cfg)
        self.run_dir, resume_from, notes = self._resolve_run()
        for note in notes:
            self.log(note)

        self.zero_stage = self._zero_stage()
        self.ep_size = self._check_expert_parallel()
        torch.manual_seed(t.seed)  # identical initial weights on every rank
        self.model = build_model(cfg)  # the plain module; the wrapped one is self.model_t
        self.model.checkpointing = t.activation_checkpointing  # how its blocks keep activations for backward
        self.step, self.tokens, self.elapsed_before = 0, 0, 0.0
        self.branch: Optional[dict] = None  # train.branch_from: {"from": parent checkpoint, "step": branch step}
        restore_optimizer = False
        if resume_from is not None:  # full (consolidated) weights, before any sharding
            restore_optimizer = self._load_checkpoint(resume_from)
        self.optimizer = self._shard_and_build_optimizer(resume_from if restore_optimizer else None)
        if self.deepspeed:
            conf = fill_deepspeed_config(self.accelerator, t, self.info.world_size, d_model=cfg.model.d_model)
            if self.ep_size > 1 and self.zero_stage == 0:
                conf["gradient_clipping"] = 0.0  # clipped by ExpertParallelClipping (true global norm)
            if self.zero_stage == 3:
                zero3_traceable_outputs(self.model)  # ZeRO-3 re-gathers the LM head for the fused loss's backward
        if t.compile and t.activation_checkpointing != "none":
            allow_compiled_recomputation()  # routing statistics recorded once, as in eager
        module = torch.compile(self.model) if t.compile else self.model
        self.model_t, self.optimizer_t = self.accelerator.prepare(module, self.optimizer)
        self.ep_clip = self._attach_expert_parallel()
        if self.deepspeed and restore_optimizer and self.ep_size == 1:
            self._load_deepspeed_state(resume_from)
        elif restore_optimizer and self.ep_size > 1 and self.zero_stage > 0:
            self._load_zero_expert_parallel_state(resume_from)
        torch.manual_seed(t.seed + 1000 * (self.info.rank + 1))  # dropout differs between ranks
        if resume_from is not None:
            ckpt.load_rng(resume_from, self.info.rank)
        self.batches = TokenBatches(self.data.train, t.seq_len, t.micro_batch_size, t.grad_accum,
                                    self.info.rank, self.info.world_size, t.seed)
        self.tokens_per_step = self.batches.global_batch_size * t.seq_len
        self.flops_per_token, self.flops_source = flops_per_token(cfg)
        self.peak_flops, self.peak_source = peak_flops(cfg, self.device)
        self.metrics: Optional[MetricsLog] = None
        if self.info.is_main:
            self._init_run_folder(resume_from)
        self.last_ckpt: Optional[Path] = resume_from
        barrier()

    # ------------------------------------------------------------------ setup helpers

    def log(self, msg: str) -> None:
        if self.info.is_main:
            print(f"[archlab] {msg}", file=sys.stderr, flush=True)

    def _resolve_run(self) -> tuple[Path, Optional[Path], list[str]]:
        """(run folder, checkpoint to resume from or None, messages), decided on rank 0."""
        result: Any = None
        if self.info.is_main:
            try:
                result = ("ok", *resolve_run(self.cfg))
            except (RecipeError, ckpt.CheckpointError) as e:
                result = ("error", type(e).__name__, str(e))
        result = broadcast_object(result)
        if result[0] == "error":
            raise (ckpt.CheckpointError if result[1] == "CheckpointError" else RecipeError)(result[2])
        return result[1], result[2], result[3]

    def _zero_stage(self) -> int:
        """The DeepSpeed config's zero_optimization.stage (0 without DeepSpeed)."""
        if not self.deepspeed:
            return 0
        conf = self.accelerator.state.deepspeed_plugin.deepspeed_config
        return int(conf.get("zero_optimization", {}).get("stage", 0))

    def _check_expert_parallel(self) -> int:
        """The recipe's moe.ep_size, refused (RecipeError) where archlab cannot shard experts."""
        moe = self.cfg.model.get("moe")
        ep = int(moe.ep_size) if moe is not None else 1
        if ep <= 1:
            return 1
        if not self.deepspeed:
            raise RecipeError(f"model.moe.ep_size={ep}: expert parallelism runs under DeepSpeed; launch with "
                              "accelerate launch --config_file recipes/launch/zero0.yaml (or set model.moe.ep_size=1)")
        if self.info.world_size % ep:
            raise RecipeError(f"model.moe.ep_size={ep} must divide the number of processes ({self.info.world_size})")
        return ep

    def _shard_and_build_optimizer(self, optimizer_from: Optional[Path]) -> torch.optim.Optimizer:
        """Shard the experts (ep_size > 1), then build AdamW over what this rank holds (expert
        parameters in DeepSpeed's MoE groups) and restore its state from ``optimizer_from``."""
        if self.ep_size > 1:
            from archlab.parallel.expert import enable_expert_parallel

            enable_expert_parallel(self.model, self.ep_size)
        optimizer = build_optimizer(self.model, self.cfg.train, expert_groups=self.ep_size > 1)
        if optimizer_from is not None and self.ep_size > 1 and self.zero_stage == 0:  # this rank's AdamW state
            optimizer.load_state_dict(_rank_optimizer_state(optimizer_from, self.info.rank, zero=False))
        elif optimizer_from is not None and not self.deepspeed:
            optimizer.load_state_dict(ckpt.load_optimizer_state(optimizer_from))
        return optimizer

    def _attach_expert_parallel(self):
        """ep_size > 1, after ``prepare``: the engine reduces expert gradients over the
        expert-data-parallel group; gradients are clipped by the global norm. Returns the clipper."""
        if self.ep_size <= 1:
            return None
        from archlab.parallel.expert import ExpertParallelClipping, attach_to_deepspeed_engine

        attach_to_deepspeed_engine(deepspeed_engine(self.accelerator), self.model)
        if self.zero_stage > 0:  # ZeRO-1/2 sums partition norms over all ranks: the global norm already
            return None
        return ExpertParallelClipping(self.optimizer, self.cfg.train.grad_clip)

    def _load_checkpoint(self, ckpt_dir: Path) -> bool:
        """Load weights, step and tokens; True when the optimizer state can be restored as well
        (same launcher kind and same ep_size), False when it restarts (logged as a warning)."""
        state = ckpt.load_state(ckpt_dir)
        ckpt.load_weights_into(self.model, ckpt_dir)
        saved_ep = int(state.get("ep_size", 1))
        restore = True
        if saved_ep != self.ep_size:
            self.log(f"warning: checkpoint was written at model.moe.ep_size={saved_ep}, this run uses {self.ep_size}: "
                     "weights loaded, the optimizer state (AdamW moments) restarts from zero")
            restore = False
        elif self.ep_size > 1:
            name = ckpt.rank_optimizer_name(self.info.rank)
            if not (ckpt_dir / name).is_file():
                raise ckpt.CheckpointError(f"{ckpt_dir / name}: missing (the checkpoint was written with fewer "
                                           "processes; resume with the same number of processes)")
        elif not self.deepspeed and not (ckpt_dir / ckpt.OPTIMIZER).is_file():
            raise ckpt.CheckpointError(f"{ckpt_dir / ckpt.OPTIMIZER}: missing (was this checkpoint written under "
                                       "DeepSpeed? resume it with the same launcher)")
        elif self.deepspeed and state.get("deepspeed") and (state.get("zero_stage", 0) == 3) != (self.zero_stage == 3):
            raise ckpt.CheckpointError(f"{ckpt_dir}: written at DeepSpeed ZeRO stage {state.get('zero_stage', '0-2')}, "
                                       f"this launch uses stage {self.zero_stage} (ZeRO-3 partitions the parameters, "
                                       "stages 0-2 do not): resume with the ZeRO stage the checkpoint was trained with")
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
        return restore

    def _starts_branch(self, ckpt_dir: Optional[Path]) -> bool:
        """Whether ``ckpt_dir`` belongs to another run folder: this run branches from it now."""
        return ckpt_dir is not None and Path(ckpt_dir).resolve().parent.parent != self.run_dir.resolve()

    def _load_deepspeed_state(self, ckpt_dir: Path) -> None:
        zero = ckpt_dir / "zero"
        if not zero.is_dir():
            raise ckpt.CheckpointError(f"{zero}: missing (the checkpoint was not written under DeepSpeed; "
                                       "resume it with the launcher it was trained with)")
        engine = deepspeed_engine(self.accelerator)
        safe_deepspeed_load(engine)
        try:
            engine.load_checkpoint(str(zero), tag="state", load_module_strict=True, load_optimizer_states=True,
                                   load_lr_scheduler_states=False)
        except Exception as e:
            raise ckpt.CheckpointError(f"{zero}: cannot load the DeepSpeed state ({str(e).splitlines()[0]})") from None

    def _load_zero_expert_parallel_state(self, ckpt_dir: Path) -> None:
        """Expert parallelism under ZeRO-1/2: this rank's ZeRO optimizer state (its partition of the
        dense groups, its experts' groups: AdamW moments and fp32 master weights), as saved by
        ``save_checkpoint``. The same number of processes and ep_size are required (checked before)."""
        sd = _rank_optimizer_state(ckpt_dir, self.info.rank, zero=True)
        zero_opt = deepspeed_engine(self.accelerator).optimizer
        # DeepSpeed indexes the list by the data-parallel rank; each rank reads only its own file
        zero_opt.load_state_dict([sd] * self.info.world_size, load_optimizer_states=True, load_from_fp32_weights=True)

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
        from archlab.data import unigram_entropy

        self.unigram_entropy = unigram_entropy(self.data.train)
        ds_conf = self.accelerator.state.deepspeed_plugin.deepspeed_config if self.deepspeed else None
        write_env(run, {
            "device": str(self.device),
            "device_name": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "world_size": self.info.world_size,
            "accelerate_distributed_type": str(self.accelerator.distributed_type),
            "accelerate_num_processes": self.accelerator.num_processes,
            "deepspeed_config": ds_conf,
            "mixed_precision": resolve_precision(self.cfg.train.precision),
            "torch_threads": torch.get_num_threads(),
            "n_params": archlab.num_params(self.cfg),
            "flops_per_token": self.flops_per_token,
            "flops_per_token_source": self.flops_source,
            "peak_flops": self.peak_flops,
            "peak_flops_source": self.peak_source,
            "mfu_definition": "tokens/s * flops_per_token / (peak_flops * world_size)",
            "tokens_per_step": self.tokens_per_step,
            "data_cache": str(self.data.cache_path),
            "data_meta": self.data.meta,
            "unigram_entropy_train": self.unigram_entropy,
            "resumed_from": str(resume_from) if resume_from else None,
            "branch_from": self.branch["from"] if self.branch else None,
            "branch_step": self.branch["step"] if self.branch else None,
        })
        self.metrics = MetricsLog(run, self.cfg.train.tensorboard)

    # ------------------------------------------------------------------ one step

    def _forward_loss(self, x_BS1: Tensor) -> tuple[Tensor, Tensor]:
        """(LM loss, aux loss) of one micro batch (B, S+1) through the wrapped model. The LM head
        and cross-entropy run fused (``targets=``), without materialising the (B, S, V) logits."""
        with self.accelerator.autocast():
            out = self.model_t(x_BS1[:, :-1], targets=x_BS1[:, 1:])
            return out.loss.float(), out.aux_loss.float()

    def _grad_norm(self) -> float:
        clip = self.cfg.train.grad_clip
        if self.ep_clip is not None:  # clipped in the optimizer's pre-step hook by the global norm
            return float("nan") if self.ep_clip.last_norm is None else self.ep_clip.last_norm
        if self.deepspeed:  # the engine clipped inside its step; it reports the norm before clipping
            norm = deepspeed_engine(self.accelerator).get_global_grad_norm()
            return 0.0 if norm is None else float(norm)
        norm = self.accelerator.clip_grad_norm_(self.model_t.parameters(), clip if clip > 0 else float("inf"))
        return float(norm)

    def train_step(self) -> dict[str, float]:
        """Forward/backward over the A micro batches of this step; returns the reduced numbers.

        Does not update the weights: :meth:`run` does, once it knows loss and grad norm are finite.
        """
        A = self.cfg.train.grad_accum
        lm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        aux_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        start_step(self.model)  # every rank, before the first micro-batch: global-batch balancing restarts its counts
        for micro in range(A):
            x_BS1 = self.batches.get(self.step, micro).to(self.device)
            with self.accelerator.accumulate(self.model_t):
                lm, aux = self._forward_loss(x_BS1)
                loss = lm + aux
                if self.deepspeed and not bool(all_reduce_sum(torch.isfinite(loss).logical_not().float()) == 0):
                    # the engine steps inside the last backward: stop before it sees a bad loss
                    raise NonFiniteError(self._nonfinite_message(float("nan"), float("nan")))
                self.accelerator.backward(loss)
            lm_sum += lm.detach().double()
            aux_sum += aux.detach().double()
        grad_norm = self._grad_norm()
        reduced = all_reduce_sum(torch.stack([lm_sum / A, aux_sum / A]).cpu())
        W = self.info.world_size
        return {"loss": float(reduced[0]) / W, "aux_loss": float(reduced[1]) / W, "grad_norm": grad_norm}

    def _nonfinite_message(self, loss: float, grad_norm: float) -> str:
        keep = f"the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else "no checkpoint was written yet"
        return (f"non-finite numbers at step {self.step + 1} (loss={loss}, grad_norm={grad_norm}): stopped before "
                f"updating the weights; {keep}. Lower train.lr, check the data, or set train.on_nonfinite=skip")

    # ------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self, multiplier: int = 1) -> dict[str, Any]:
        """Validation loss at context ``multiplier * seq_len``: token-loss sums and counts all-reduced."""
        from archlab.data import DataError, eval_windows

        t, m = self.cfg.train, self.cfg.model
        S = t.seq_len * multiplier
        row: dict[str, Any] = {"kind": "val", "step": self.step, "tokens": self.tokens, "context_len": S,
                               "context_multiplier": multiplier}
        limit = position_class(m).max_length(m)
        if limit is not None and S > limit:
            return {**row, "skipped": f"{m.position.type} positions end at {limit} (model.max_seq_len={m.max_seq_len})"}
        B = max(1, t.micro_batch_size // multiplier)  # about the same tokens per batch at every length
        try:
            windows = eval_windows(self.data.val, S, B, t.eval_batches, self.info.rank, self.info.world_size)
        except DataError as e:
            return {**row, "skipped": str(e)}
        sums = torch.zeros(2, dtype=torch.float64)
        windows = list(windows)
        # expert parallelism (every forward exchanges tokens with the other ranks) and ZeRO-3 (every
        # forward gathers the partitioned parameters from all ranks): every rank runs as many forwards
        # as the busiest one; the extra ones (a window of zeros) count nothing
        collective = self.ep_size > 1 or self.zero_stage == 3
        n_forwards = int(all_reduce_max(torch.tensor(float(len(windows))))) if collective else len(windows)
        net = self.model_t if self.zero_stage == 3 else self.model  # ZeRO-3: the engine's forward gathers
        self.model.eval()
        for i in range(n_forwards):
            x_BS1 = (windows[i] if i < len(windows) else torch.zeros(1, S + 1, dtype=torch.long)).to(self.device)
            with self.accelerator.autocast():
                logits = net(x_BS1[:, :-1]).logits
            if i < len(windows):
                sums[0] += float(lm_loss(logits, x_BS1[:, 1:], reduction="sum"))
                sums[1] += x_BS1[:, 1:].numel()
        self.model.train()
        sums = all_reduce_sum(sums)
        loss = float(sums[0] / sums[1])
        return {**row, "loss": loss, "ppl": math.exp(min(loss, 50.0)), "eval_tokens": int(sums[1])}

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, elapsed: float) -> Path:
        """Write a checkpoint of the current step atomically (collective: every rank calls it)."""
        run = self.run_dir
        if self.info.is_main:
            ckpt.begin(run, self.step)
        barrier()
        tmp = ckpt.tmp_dir(run, self.step)
        ckpt.save_rng(tmp, self.info.rank)
        weights: Any = self.model
        if self.ep_size > 1:  # each rank holds its experts: gather them; each rank saves its AdamW state
            from archlab.parallel.expert import consolidated_state_dict

            weights = consolidated_state_dict(self.model)
            opt = deepspeed_engine(self.accelerator).optimizer if self.zero_stage > 0 else self.optimizer
            torch.save(opt.state_dict(), tmp / ckpt.rank_optimizer_name(self.info.rank))  # ZeRO-1/2: its partition
        elif self.deepspeed:
            deepspeed_engine(self.accelerator).save_checkpoint(str(tmp / "zero"), tag="state", save_latest=False)
            if self.zero_stage == 3:  # the parameters are partitioned: gathered, onto rank 0 (collective)
                weights = zero3_consolidated_state_dict(deepspeed_engine(self.accelerator))
        if self.info.is_main:
            ckpt.save_model_weights(weights, tmp / ckpt.WEIGHTS)
            if not self.deepspeed:
                torch.save(self.optimizer.state_dict(), tmp / ckpt.OPTIMIZER)
            t = self.cfg.train
            ckpt.write_json_atomic(tmp / ckpt.STATE, {
                "step": self.step, "tokens": self.tokens, "elapsed_s": elapsed, "world_size": self.info.world_size,
                "global_batch": t.micro_batch_size * t.grad_accum * self.info.world_size,
                "deepspeed": self.deepspeed, "zero_stage": self.zero_stage, "ep_size": self.ep_size,
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

    # ------------------------------------------------------------------ the loop

    def _moe_after_step(self, log_now: bool) -> dict[str, Any]:
        from archlab.nn.moe import balance_step, moe_layers, routing_stats

        if not moe_layers(self.model):
            return {}
        balance_step(self.model, all_reduce_sum)
        if not log_now:
            return {}
        check_local_routing(self.model, self.info.rank)
        return routing_stats(self.model, all_reduce_sum)

    def _write(self, row: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.write(row)

    def run(self) -> dict[str, Any]:
        """Train to ``train.max_steps`` (or a stop signal); return the summary."""
        from tqdm.auto import tqdm

        t = self.cfg.train
        stop = StopSignal()
        self._start = time.perf_counter()
        bar = tqdm(total=t.max_steps, initial=self.step, disable=not self.info.is_main, desc=self.cfg.name,
                   unit="step", dynamic_ncols=True, file=sys.stderr, mininterval=1.0)
        self._window = _Window()
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

    def close(self) -> None:
        """Let go of the run's engine, wrapped model and optimizer (accelerate's ``free_memory``:
        a DeepSpeed engine's gradient hooks otherwise keep it, its ZeRO optimizer and every
        parameter's process-group handle alive until interpreter exit). Idempotent; the Trainer
        cannot train after it. ``archlab.train.train`` calls it; so should a script that drives a
        Trainer itself, before :func:`archlab.train.dist.shutdown_distributed`."""
        self.accelerator.free_memory()
        self.model_t = self.optimizer_t = None

    def elapsed(self) -> float:
        """Training wall time of the whole run, across resumes."""
        return self.elapsed_before + time.perf_counter() - self._start

    def _one_step(self, bar) -> None:
        """One optimizer step (or a skipped batch), its metrics row and the MoE bookkeeping."""
        t = self.cfg.train
        lr = lr_at(self.step, t)
        set_lr(self.optimizer_t, lr)
        r = self.train_step()
        if not (math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"])):
            self.optimizer_t.zero_grad(set_to_none=True)
            if t.on_nonfinite == "stop":
                raise NonFiniteError(self._nonfinite_message(r["loss"], r["grad_norm"]))
            self.step += 1
            self.log(f"step {self.step}: non-finite loss/grad norm ({r['loss']}, {r['grad_norm']}): batch skipped")
            self._write({"kind": "skip", "step": self.step, "tokens": self.tokens, **r})
            bar.update(1)
            return
        self.optimizer_t.step()
        self.optimizer_t.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens += self.tokens_per_step
        self._window.add(self.tokens_per_step, r["loss"])
        log_now = self.step % t.log_every == 0 or self.step == t.max_steps
        routing_now = self.step % (t.routing_every or t.log_every) == 0
        moe = self._moe_after_step(log_now or routing_now)
        if moe and routing_now and self.metrics is not None:
            self.metrics.write_routing({"step": self.step, "tokens": self.tokens, **moe})
        if log_now:
            tok_s, loss_avg = self._window.take()
            self._write({"kind": "train", "step": self.step, "tokens": self.tokens, "loss": r["loss"],
                         "loss_avg": loss_avg, "aux_loss": r["aux_loss"], "lr": lr, "grad_norm": r["grad_norm"],
                         "tokens_per_s": tok_s, "flops_per_token": self.flops_per_token,
                         "mfu": tok_s * self.flops_per_token / (self.peak_flops * self.info.world_size),
                         "elapsed_s": self.elapsed(), **moe})
            bar.set_postfix(loss=f"{r['loss']:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
        bar.update(1)

    def _periodic(self, eval_now: bool, ckpt_now: bool) -> None:
        """Validation and checkpoint between steps (not at the last step: the end of run does both)."""
        if self.step >= self.cfg.train.max_steps:
            return
        t0 = time.perf_counter()
        if eval_now:
            self._write(self.evaluate(1))
        if ckpt_now:
            self.save_checkpoint(self.elapsed())
        self._window.pause(time.perf_counter() - t0)

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
            "final_val_skipped": {str(r["context_len"]): r["skipped"] for r in final_val if "skipped" in r},
            "unigram_entropy_train": self.unigram_entropy,
            "mean_tokens_per_s": (sum(r["tokens_per_s"] for r in train) / len(train)) if train else None,
            "flops_per_token": self.flops_per_token,
            "training_flops": self.flops_per_token * self.tokens,
            "n_params": archlab.num_params(self.cfg),
        })
        ckpt.write_json_atomic(self.run_dir / SUMMARY, summary)
        if train:
            plot_losses(self.run_dir, self.cfg.name)
        if self.metrics is not None:
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


def train(cfg: DictConfig) -> dict[str, Any]:
    """Train the recipe ``cfg`` (a loaded DictConfig) and return the run's summary.

    Raises RecipeError / DataError / CheckpointError for bad input and NonFiniteError when the
    loss or gradient stops being finite (train.on_nonfinite=stop).
    """
    trainer = Trainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()
