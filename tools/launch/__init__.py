"""Where a sweep's runs train: as processes of this machine (``local``) or as SLURM jobs (``slurm``, submitit).

A launcher has ``start(point, cmd, env) -> run``; a run has ``poll_with_peak_rss()`` (exit code or None
while it runs, peak resident bytes), ``stop()`` (the trainer saves a checkpoint and exits),
``interrupted()`` (Ctrl-C reached the sweep), ``describe()`` and ``job`` (what the sweep's manifest
records of it). Either way the command is the same ``python -m archlab.train ...``, writing the same
run folder and log. ``tools.sweep`` and ``tools.experiment`` take ``--launcher slurm`` and the
``--slurm-*`` options of :func:`add_arguments`; :func:`use` sets the launcher of every sweep run
inside it (an experiment's stages start their sweeps several calls down).

``--nodes N --gpus-per-node G`` (with ``--launcher slurm``) makes each run ONE job of N tasks, one per node,
each starting ``accelerate launch`` as one machine of the run (:mod:`tools.launch.multinode`): N x G processes
(N without GPUs), ``--accelerate-config`` naming the accelerate config (DDP by default; a DeepSpeed one
for expert parallelism). ``python -m tools.launch RECIPE ...`` (:mod:`tools.launch.cli`) submits a single run.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Optional

from tools.launch.errors import LaunchError
from tools.launch.local import LocalLauncher
from tools.launch.slurm import SlurmLauncher, SlurmOptions
from tools.launch.slurm import recorded_state as slurm_state

_current: contextvars.ContextVar = contextvars.ContextVar("archlab_launcher", default=None)


def current():
    """The launcher set by :func:`use`, else the local one."""
    return _current.get() or LocalLauncher()


@contextlib.contextmanager
def use(launcher) -> Iterator[None]:
    token = _current.set(launcher)
    try:
        yield
    finally:
        _current.reset(token)


def add_arguments(ap) -> None:
    """The ``--slurm-*`` options (each job's resources) as an argument group of ``ap``."""
    g = ap.add_argument_group("SLURM (with --launcher slurm: each run one job, submitted through submitit)")
    g.add_argument("--slurm-partition", metavar="NAME", help="partition of every job (default: the cluster's)")
    g.add_argument("--slurm-time", type=int, metavar="MIN",
                   help="time limit of each job in minutes (default 60); a run that reaches it saves a checkpoint "
                        "and its job is requeued to go on")
    g.add_argument("--slurm-cpus", type=int, metavar="N",
                   help="CPUs per job (default: the cluster's); also the trainer's torch threads unless --threads")
    g.add_argument("--slurm-mem", type=float, metavar="GB", help="memory per job in GB (default: the cluster's)")
    g.add_argument("--slurm-gpus", type=int, metavar="N", help="GPUs per job (default none)")
    g.add_argument("--slurm-timeouts", type=int, metavar="N",
                   help="times a job may reach its time limit and be requeued (default 3; preemptions always requeue)")
    g.add_argument("--slurm-set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="other submitit SLURM parameters, e.g. account=proj qos=high constraint=a100 "
                        "signal_delay_s=120 (how long before the limit the run is told to save; default 90)")
    g.add_argument("--nodes", type=int, metavar="N",
                   help="multi-node: each run one job of N nodes, one task per node starting accelerate launch with "
                        "the rendezvous from SLURM (N x --gpus-per-node processes); --slurm-cpus: per node")
    g.add_argument("--gpus-per-node", type=int, metavar="G",
                   help="with --nodes: GPUs of each node, one process each (default 0: one CPU process per node, gloo)")
    g.add_argument("--accelerate-config", metavar="FILE",
                   help="with --nodes: the accelerate config of every machine (default DDP; e.g. "
                        "recipes/launch/multinode-8gpu.yaml, or recipes/launch/zero2.yaml for expert parallelism); "
                        "the launcher sets its machines, rank, main host and port")


SLURM_FLAGS = ("slurm_partition", "slurm_time", "slurm_cpus", "slurm_mem", "slurm_gpus", "slurm_timeouts", "slurm_set",
               "nodes", "gpus_per_node", "accelerate_config")


def from_args(args, cluster: str = "slurm"):
    """The launcher the parsed options ask for (``args.launcher``: python/accelerate/local -> local, slurm);
    raises LaunchError on an option that would do nothing or a value SLURM would refuse."""
    given = [f"--{k.replace('_', '-')}" for k in SLURM_FLAGS if getattr(args, k, None) not in (None, [])]
    if args.launcher != "slurm":
        if given:
            raise LaunchError(f"{', '.join(given)}: SLURM options need --launcher slurm")
        return LocalLauncher()
    return SlurmLauncher(options_from_args(args), cluster=cluster)


def options_from_args(args) -> SlurmOptions:
    """The jobs' :class:`SlurmOptions` from the parsed ``--slurm-*``, ``--nodes`` and ``--gpus-per-node``."""
    extra = {}
    for item in getattr(args, "slurm_set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise LaunchError(f"--slurm-set {item!r}: expected KEY=VALUE (e.g. account=myproject)")
        extra[key.strip()] = _value(value)
    time_min = 60 if args.slurm_time is None else args.slurm_time
    timeouts = 3 if args.slurm_timeouts is None else args.slurm_timeouts
    return SlurmOptions(partition=args.slurm_partition, time_min=time_min, cpus=args.slurm_cpus,
                        mem_gb=args.slurm_mem, gpus=args.slurm_gpus, timeouts=timeouts, extra=extra,
                        nodes=getattr(args, "nodes", None), gpus_per_node=getattr(args, "gpus_per_node", None),
                        accelerate_config=getattr(args, "accelerate_config", None))


def world_size(args) -> int:
    """Processes of each run the parsed options ask for: 1 unless ``--launcher slurm --nodes``."""
    if getattr(args, "launcher", None) != "slurm":
        return 1
    return options_from_args(args).world_size


def _value(text: str):
    """An int where the text is one (submitit checks types: signal_delay_s=120), else the text."""
    try:
        return int(text)
    except ValueError:
        return text


def recorded_state(job: Optional[dict]) -> Optional[str]:
    """The scheduler's state of a job a manifest records, None for a local run."""
    if not job or job.get("launcher") != "slurm":
        return None
    return slurm_state(job)
