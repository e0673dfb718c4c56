"""The SLURM launcher: each run one job, submitted through submitit, resumable, its state read from the scheduler.

A job runs :class:`TrainJob`: the same ``python -m archlab.train`` command a local run runs, as a child
process whose output is appended to the point's log file, writing the same run folder. Before a time
limit or at a preemption SLURM sends the job USR2 (submitit's ``--signal=USR2@signal_delay_s``);
submitit calls :meth:`TrainJob.checkpoint`, which asks the trainer to save a checkpoint and exit
(SIGTERM, as Ctrl-C does locally), then requeues the job; the requeued job continues the run folder
with ``train.resume=auto``. Time limits may requeue a job ``timeouts`` times (submitit's
``max_num_timeout``); preemptions always requeue. submitit's own files (the pickled job, its
sbatch script and logs) go to ``<sweep folder>/slurm/<job id>/``. A job's state is the scheduler's:
``scontrol show job`` while the controller knows the job, then ``sacct`` through submitit.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tools.launch import multinode
from tools.launch.errors import LaunchError
from tools.launch.local import poll_with_peak_rss, start_process

INSTALL = "pip install -e '.[slurm]'"
# states in which a job may still run (or run again): everything else has ended
ACTIVE = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "COMPLETING", "SUSPENDED",
          "RESIZING", "SIGNALING", "STAGE_OUT", "PREEMPTED", "RESV_DEL_HOLD"}
# ended without finishing by a stop from outside (scancel, a time limit, a preemption not requeued): resumable
STOPPED = {"CANCELLED", "TIMEOUT", "PREEMPTED", "DEADLINE"}
RESUME = "train.resume=auto"
GRACE_S = 60  # how long a checkpoint waits for the trainer to save and exit (keep below signal_delay_s)
# the options that have their own flags, by submitit's name for them (not to be given again with --slurm-set)
OWN_FLAGS = {"partition": "--slurm-partition", "time": "--slurm-time", "cpus_per_task": "--slurm-cpus",
             "mem": "--slurm-mem", "gpus_per_node": "--slurm-gpus or --gpus-per-node", "nodes": "--nodes",
             "job_name": "(the point's name)"}


def _submitit():
    try:
        import submitit
    except ImportError:
        raise LaunchError(f"--launcher slurm needs submitit, which is not installed: {INSTALL}") from None
    return submitit


@dataclass
class SlurmOptions:
    """The resources of every job (``--slurm-*``) and submitit's other SLURM parameters (``--slurm-set``)."""

    partition: Optional[str] = None
    time_min: int = 60
    cpus: Optional[int] = None
    mem_gb: Optional[float] = None
    gpus: Optional[int] = None
    timeouts: int = 3
    extra: dict = field(default_factory=dict)  # submitit SlurmExecutor parameters: account, qos, constraint, ...
    # multi-node (tools.launch.multinode): one job of `nodes` x ntasks_per_node tasks, each task a machine of
    # `accelerate launch` with gpus_per_node processes (1 without GPUs); None: a single `python -m archlab.train`
    nodes: Optional[int] = None
    gpus_per_node: Optional[int] = None
    accelerate_config: Optional[str] = None

    @property
    def multinode(self) -> bool:
        """One ``accelerate launch`` per task (``--nodes``/``--gpus-per-node`` given), not a single process."""
        return self.nodes is not None or self.gpus_per_node is not None

    @property
    def machines(self) -> int:
        """accelerate's machines: the job's tasks (one per node; ``--slurm-set ntasks_per_node=2`` makes one node
        stand in for two machines)."""
        return (self.nodes or 1) * int(self.extra.get("ntasks_per_node", 1))

    @property
    def world_size(self) -> int:
        """Processes of one run: every machine's, one per GPU (one per machine without GPUs)."""
        return self.machines * max(1, self.gpus_per_node or 0) if self.multinode else 1

    def check(self) -> None:
        """Refuse (LaunchError) a value SLURM would refuse later, or a parameter submitit does not know."""
        for flag, value in (("--slurm-time", self.time_min), ("--slurm-cpus", self.cpus), ("--slurm-mem", self.mem_gb),
                            ("--slurm-timeouts", self.timeouts), ("--nodes", self.nodes)):
            if value is not None and not value > 0:
                raise LaunchError(f"{flag} {value}: must be > 0")
        for flag, value in (("--slurm-gpus", self.gpus), ("--gpus-per-node", self.gpus_per_node)):
            if value is not None and value < 0:
                raise LaunchError(f"{flag} {value}: must be >= 0")
        self._check_multinode()
        valid = set(_submitit().SlurmExecutor._valid_parameters())
        for key in self.extra:
            if key in OWN_FLAGS:
                raise LaunchError(f"--slurm-set {key}=...: set it with {OWN_FLAGS[key]}")
            if key not in valid:
                near = difflib.get_close_matches(key, sorted(valid), n=3)
                raise LaunchError(f"--slurm-set {key}=...: not a submitit SLURM parameter"
                                  + (f" (did you mean {', '.join(near)}?)" if near else "")
                                  + f"; valid: {', '.join(sorted(valid - set(OWN_FLAGS)))}")

    def _check_multinode(self) -> None:
        if self.gpus is not None and self.gpus_per_node is not None:
            raise LaunchError(f"--slurm-gpus {self.gpus} and --gpus-per-node {self.gpus_per_node}: give one "
                              "(--gpus-per-node with --nodes: each node's GPUs, one process each)")
        if self.accelerate_config is not None:
            if not self.multinode:
                raise LaunchError(f"--accelerate-config {self.accelerate_config}: needs --nodes (and --gpus-per-node): "
                                  "a single-process job does not start accelerate")
            if not Path(self.accelerate_config).is_file():
                raise LaunchError(f"--accelerate-config {self.accelerate_config}: file not found (e.g. "
                                  "recipes/launch/multinode-8gpu.yaml, or zero2.yaml for expert parallelism)")
        tasks = self.extra.get("ntasks_per_node", 1)
        if not isinstance(tasks, int) or tasks < 1:
            raise LaunchError(f"--slurm-set ntasks_per_node={tasks}: must be an integer >= 1")
        if tasks > 1 and not self.multinode:
            raise LaunchError(f"--slurm-set ntasks_per_node={tasks}: several tasks need --nodes (each task one "
                              "machine of accelerate launch); a single-process job runs one task")
        if tasks > 1 and self.gpus_per_node:
            raise LaunchError(f"--slurm-set ntasks_per_node={tasks} with --gpus-per-node {self.gpus_per_node}: "
                              "with GPUs each node runs one task, which owns the node's GPUs; drop ntasks_per_node")

    def parameters(self, name: str) -> dict:
        """For ``AutoExecutor.update_parameters``: shared names where submitit has them, ``slurm_*`` otherwise."""
        extra = {f"slurm_{k}": v for k, v in self.extra.items()}
        gpus = (self.gpus_per_node or None) if self.multinode else self.gpus
        params = {"name": name, "timeout_min": int(self.time_min), "cpus_per_task": self.cpus, "mem_gb": self.mem_gb,
                  "gpus_per_node": gpus, "slurm_partition": self.partition, **extra}
        if self.multinode:  # one task per node (each task starts accelerate launch for the node's GPUs)
            params.update(nodes=self.nodes or 1, tasks_per_node=extra.pop("slurm_ntasks_per_node", 1))
            params.pop("slurm_ntasks_per_node", None)
        return params


class TrainJob:
    """What a job runs: the trainer's command as a child process, its output appended to the point's log.

    Requeue protocol (submitit calls ``checkpoint`` on USR2, as for ``submitit.helpers.Checkpointable``;
    not subclassed so that this module imports submitit only when used): the trainer is asked to save and
    exit, and the same job object is submitted again; ``__call__`` then resumes the run folder."""

    def __init__(self, cmd: list[str], env: dict, log: str, run_dir: str, cwd: str):
        self.cmd, self.env, self.log, self.run_dir, self.cwd = list(cmd), dict(env), log, run_dir, cwd
        self._proc: Optional[subprocess.Popen] = None
        self._signalled = False

    def command(self) -> list[str]:
        """The command, continuing the run folder if an earlier attempt (or invocation) started it."""
        started = Path(self.run_dir).is_dir() and RESUME not in self.cmd
        return self.cmd + [RESUME] if started else self.cmd

    def __call__(self) -> dict:
        """Train; return the trainer's exit code and peak resident bytes (as a local run records them)."""
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):  # scancel, a preemption: under SLURM the trainer got the signal too
            self._signalled = True
            if "SLURM_JOB_ID" not in os.environ and self._proc is not None:  # submitit's local executor
                self._proc.send_signal(signal.SIGTERM)
            if callable(previous):
                previous(signum, frame)

        signal.signal(signal.SIGTERM, on_term)
        where = f"# SLURM job {os.environ.get('SLURM_JOB_ID', os.environ.get('SUBMITIT_LOCAL_JOB_ID', '?'))} " \
                f"on {socket.gethostname()}\n"
        cmd = self.command()  # before the first line of the log: a multi-node task names its machine there
        self._proc = start_process(cmd, {**os.environ, **self.env}, Path(self.task_log()), self.cwd,
                                   where + self.header(), preexec_fn=_ignore_preemption_signal)
        while True:
            rc, peak_rss = poll_with_peak_rss(self._proc)
            if rc is not None:
                return {"returncode": rc, "peak_rss_bytes": peak_rss}
            time.sleep(0.5)

    def checkpoint(self, *args, **kwargs):
        """The job is about to be stopped: the trainer saves after its current step and exits; requeue."""
        from submitit.helpers import DelayedSubmission

        proc = self._proc
        if proc is not None and proc.poll() is None:
            if not self._signalled:  # a second SIGTERM would make the trainer exit at once, unsaved
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass  # SLURM kills it with the job; the requeued job resumes from the last checkpoint
        return DelayedSubmission(self, *args, **kwargs)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_proc": None, "_signalled": False}

    def task_log(self) -> str:
        return self.log

    def header(self) -> str:
        return ""


class MultiNodeTrainJob(TrainJob):
    """What each task of a multi-node job runs: ``accelerate launch`` as one machine of the run
    (:mod:`tools.launch.multinode`), its output appended to the point's log (task 0) or to
    ``<log stem>.task<R>.log``. Every task passes ``train.resume=auto`` (the run folder needs
    ``train.run_name``): a fresh folder starts at step 0, a started one continues from its newest
    complete checkpoint, and no task decides otherwise than another by looking at the folder first.
    submitit calls :meth:`checkpoint` in task 0 only; the stop reaches the other machines' ranks
    through the trainer (every rank stops at the same step)."""

    def __init__(self, cmd: list[str], env: dict, log: str, run_dir: str, cwd: str, machines: int,
                 per_machine: int, config: Optional[str] = None):
        super().__init__(cmd, env, log, run_dir, cwd)
        self.machines, self.per_machine, self.config = machines, per_machine, config
        self._rdzv: Optional[multinode.Rendezvous] = None

    def command(self) -> list[str]:
        self._rdzv = rdzv = multinode.rendezvous(os.environ)
        if rdzv.machines != self.machines:
            raise LaunchError(f"the job has {rdzv.machines} tasks (SLURM_NTASKS), the run asked for {self.machines} "
                              "machines: each task must be one machine")
        train = self.cmd if RESUME in self.cmd else self.cmd + [RESUME]
        return multinode.accelerate_command(train, rdzv, self.per_machine, self.config)

    def task_log(self) -> str:
        rank = int(os.environ.get("SLURM_PROCID", "0"))
        return self.log if rank == 0 else str(Path(self.log).with_suffix(f".task{rank}.log"))

    def header(self) -> str:
        r = self._rdzv
        return f"# machine {r.rank} of {r.machines}, main process {r.host}:{r.port}\n" if r else ""

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_rdzv": None}


def _ignore_preemption_signal() -> None:
    """In the trainer's process: SLURM's warning signal (USR2) is for the job's Python, which forwards
    a SIGTERM; by default USR2 would kill the trainer unsaved."""
    name = "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    signal.signal(getattr(signal, name, signal.SIGUSR2), signal.SIG_IGN)


def _scontrol_state(job_id: str) -> Optional[str]:
    """JobState from ``scontrol show job`` (known while the job is active and MinJobAge after); "GONE" when
    the controller no longer knows it; None when the controller could not be asked."""
    if shutil.which("scontrol") is None:
        return None
    try:
        out = subprocess.run(["scontrol", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"JobState=(\S+)", out.stdout)
    if m:
        return m.group(1)
    return "GONE" if "Invalid job id" in out.stderr + out.stdout else None


def job_state(job) -> str:
    """The scheduler's word for a submitit job: ``scontrol show job`` while the controller knows it (active
    and MinJobAge after), else sacct's through submitit's watcher (accounting); UNKNOWN when neither answers."""
    state = _scontrol_state(job.job_id) if job.__class__.__name__ == "SlurmJob" else None
    if state in (None, "GONE"):
        state = str(job.state).split()[0].upper() if job.state else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
    if state == "FINISHED":  # submitit's local executor: the process ended (its result says how)
        state = "COMPLETED"
    return state


def recorded_state(job: dict) -> str:
    """The scheduler's state of a job a manifest records (``{"launcher": "slurm", "id", "folder"}``)."""
    try:
        submitit = _submitit()
    except ValueError:
        return "UNKNOWN (submitit not installed)"
    if shutil.which("squeue") is None:
        return "UNKNOWN (no SLURM client here)"
    return job_state(submitit.SlurmJob(folder=job["folder"], job_id=job["id"]))


class SlurmRun:
    """A run as a job: polled through its result file and the scheduler's state."""

    def __init__(self, job, log: str, attached: bool = False):
        self.handle, self.log = job, log
        self.first = job.task(0) if job.num_tasks > 1 else job  # task 0 (rank 0's trainer) returns the run's result
        self.job = {"launcher": "slurm", "id": str(job.job_id), "folder": str(job.paths.folder), "state": "PENDING"}
        self.attached = attached
        self._gone_since: Optional[float] = None
        self._asked = 0.0

    def poll_with_peak_rss(self) -> tuple[Optional[int], Optional[int]]:
        if self.first.paths.result_pickle.exists():
            self.job["state"] = "COMPLETED"
            try:
                result = self.first.result()
            except Exception as e:  # noqa: BLE001 - the job raised: its traceback goes to the point's log
                self._note(f"SLURM job {self.job['id']} raised: {e}")
                self.job["state"] = "FAILED"
                return 1, None
            return int(result["returncode"]), result["peak_rss_bytes"]
        if time.time() - self._asked < 5:  # ask the scheduler every 5 s at most
            return None, None
        self._asked = time.time()
        self.job["state"] = state = job_state(self.handle)
        if state in ACTIVE or state == "UNKNOWN":
            self._gone_since = None
            return None, None
        # ended without a result file: wait a little for it (a shared file system may show it late)
        self._gone_since = self._gone_since or time.time()
        if time.time() - self._gone_since < 10:
            return None, None
        self._note(f"SLURM job {self.job['id']} ended {state} without a result; submitit's logs: {self.job['folder']}")
        return (-int(signal.SIGTERM) if state in STOPPED else 1), None

    def _note(self, text: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"[archlab.launch] {text}\n")

    def stop(self) -> None:
        """SIGTERM to the job's processes: the trainer saves after its current step and exits, the job ends."""
        if self.handle.__class__.__name__ == "SlurmJob":
            subprocess.run(["scancel", "--signal=TERM", self.job["id"]], check=False)
        else:  # submitit's local executor: its controller forwards SIGTERM to the job's Python, which forwards it
            os.kill(int(self.job["id"]), signal.SIGTERM)

    interrupted = stop  # Ctrl-C reached the sweep, not the jobs: stop them as Ctrl-C stops local runs

    def describe(self) -> str:
        return f"SLURM job {self.job['id']}" + (" (already queued: followed)" if self.attached else "")


class SlurmLauncher:
    """Submits each run as a job with :class:`SlurmOptions`; ``cluster="local"`` runs the same jobs through
    submitit's LocalExecutor on this machine (the fast tests), without SLURM."""

    name = "slurm"

    def __init__(self, options: Optional[SlurmOptions] = None, cluster: str = "slurm"):
        self.submitit = _submitit()
        self.options = options or SlurmOptions()
        self.options.check()
        self.cluster = cluster
        if cluster == "slurm" and shutil.which("sbatch") is None:
            raise LaunchError("--launcher slurm: sbatch is not on PATH here; run the sweep where jobs can be "
                              "submitted (a login node of the cluster)")

    def start(self, p, cmd: list[str], env: dict) -> SlurmRun:
        """Submit point ``p`` (its ``name``, ``log``, ``run_dir``, ``job``), or follow its job when the manifest
        records one that is still queued or running (a sweep restarted while its jobs went on)."""
        folder = Path(p.run_dir).parent / "slurm"
        old = getattr(p, "job", None) or {}
        if self.cluster == "slurm" and old.get("launcher") == "slurm" and old.get("id"):
            job = self.submitit.SlurmJob(folder=old["folder"], job_id=old["id"])
            if job_state(job) in ACTIVE:
                return SlurmRun(job, p.log, attached=True)
        executor = self.submitit.AutoExecutor(folder=folder / "%j", cluster=self.cluster,
                                              **{f"{self.cluster}_max_num_timeout": self.options.timeouts})
        executor.update_parameters(**self.options.parameters(p.name))
        overrides = {k: v for k, v in env.items() if os.environ.get(k) != v}
        if self.options.cpus and "OMP_NUM_THREADS" not in env:  # torch's threads: the CPUs the job holds
            overrides["OMP_NUM_THREADS"] = overrides["MKL_NUM_THREADS"] = str(self.options.cpus)
        o = self.options
        if o.multinode:
            config = str(Path(o.accelerate_config).resolve()) if o.accelerate_config else None
            task = MultiNodeTrainJob(cmd, overrides, p.log, p.run_dir, os.getcwd(), o.machines,
                                     max(1, o.gpus_per_node or 0), config)
        else:
            task = TrainJob(cmd, overrides, p.log, p.run_dir, os.getcwd())
        pickles = set(folder.glob("*.pkl"))
        try:
            with contextlib.redirect_stderr(io.StringIO()):  # submitit prints sbatch's refusal: said once, below
                job = executor.submit(task)
        except Exception as e:  # noqa: BLE001 - sbatch refused (submitit's FailedJobError, a missing client)
            for left in set(folder.glob("*.pkl")) - pickles:  # the pickled job of a submission that never was
                left.unlink(missing_ok=True)
            said = [line.strip().removeprefix("sbatch: error: ") for line in str(e).splitlines() if line.strip()]
            raise LaunchError(f"sbatch refused the job of {p.name}: {'; '.join(said) or type(e).__name__}"
                              f" (check the --slurm-* options and --nodes against the cluster: sinfo)") from None
        return SlurmRun(job, p.log)
