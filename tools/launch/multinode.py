"""One run across the tasks of one SLURM job: each task a machine of ``accelerate launch``.

Every task of the job (one per node; ``--slurm-set ntasks_per_node=2`` lets one node stand in for two
machines) turns the trainer's ``python -m archlab.train ...`` into

    accelerate launch [--config_file F] --num_machines M --machine_rank R --main_process_ip HOST
        --main_process_port P --num_processes M*G --rdzv_backend static --same_network
        --deepspeed_multinode_launcher standard -m archlab.train ...

with the rendezvous from SLURM's environment, as torchtitan's ``multinode_trainer.slurm`` does for
torchrun: M = ``SLURM_NTASKS``, R = ``SLURM_PROCID``, HOST the first name of ``scontrol show hostnames
$SLURM_JOB_NODELIST``, P derived from ``SLURM_JOB_ID`` (the same in every task, different between jobs).
``--deepspeed_multinode_launcher standard`` makes a DeepSpeed config (zero*.yaml, expert parallelism)
start torchrun on each machine instead of DeepSpeed's pdsh launcher (which needs ssh between nodes).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Mapping, Optional

from tools.launch.errors import LaunchError

ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
TRAINER = ["-m", "archlab.train"]


@dataclass(frozen=True)
class Rendezvous:
    """Where this task stands in the job: accelerate's machines, this machine's rank, the main host and port."""

    machines: int
    rank: int
    host: str
    port: int


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``node[01-04]`` -> ``node01``), expanded by ``scontrol``."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=60, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
        raise LaunchError(f"scontrol show hostnames {nodelist!r} failed ({e}): cannot find the main host") from None
    if not out:
        raise LaunchError(f"scontrol show hostnames {nodelist!r} printed no host: cannot find the main host")
    return out[0]


def port_of(job_id: str) -> int:
    """The main process's port: every task of a job computes the same one, jobs sharing a node differ."""
    return 20000 + int(str(job_id).split("_")[0]) % 20000


def rendezvous(env: Mapping[str, str]) -> Rendezvous:
    """This task's rendezvous, read from SLURM's environment of a job step (``srun``)."""
    missing = [k for k in ("SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_JOB_NODELIST") if k not in env]
    if missing:
        raise LaunchError(f"{', '.join(missing)} not set: a multi-node run starts inside a SLURM job step (srun)")
    return Rendezvous(machines=int(env["SLURM_NTASKS"]), rank=int(env["SLURM_PROCID"]),
                      host=first_host(env["SLURM_JOB_NODELIST"]), port=port_of(env["SLURM_JOB_ID"]))


def accelerate_command(train_cmd: list[str], rdzv: Rendezvous, per_machine: int,
                       config: Optional[str] = None) -> list[str]:
    """``accelerate launch`` on one machine of the run, for the trainer's ``python -m archlab.train ...``."""
    if train_cmd[1:3] != TRAINER:
        raise LaunchError(f"a multi-node job starts 'python -m archlab.train ...', not {' '.join(train_cmd[:3])}")
    world = rdzv.machines * per_machine
    cmd = list(ACCELERATE)
    if config:
        cmd += ["--config_file", config]
    elif world > 1:
        cmd += ["--multi_gpu"]  # DDP; without GPUs the trainer makes it MULTI_CPU over gloo
    cmd += ["--num_machines", str(rdzv.machines), "--machine_rank", str(rdzv.rank),
            "--main_process_ip", rdzv.host, "--main_process_port", str(rdzv.port), "--num_processes", str(world),
            "--rdzv_backend", "static", "--same_network", "--deepspeed_multinode_launcher", "standard"]
    return cmd + train_cmd[1:]
