"""The local launcher: each run a background process on this machine, its output appended to its log."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional


def poll_with_peak_rss(proc: subprocess.Popen) -> tuple[Optional[int], Optional[int]]:
    """(exit code or None while running, peak resident bytes of the ended child or None).

    ``os.wait4`` reaps the child and returns its rusage: ``ru_maxrss`` is the largest resident set
    of the child (or of a descendant it waited for; KiB on Linux, bytes on macOS). Where wait4
    does not exist, plain ``poll`` and no memory figure."""
    if not hasattr(os, "wait4") or proc.returncode is not None:
        return proc.poll(), None
    try:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
    except ChildProcessError:  # reaped elsewhere
        return proc.poll(), None
    if pid == 0:
        return None, None
    proc.returncode = os.waitstatus_to_exitcode(status)  # so that Popen never waits for it again
    scale = 1 if sys.platform == "darwin" else 1024
    return proc.returncode, int(usage.ru_maxrss) * scale


def start_process(cmd: list[str], env: Optional[dict], log: Path, cwd: Optional[str] = None,
                  header: str = "", **popen) -> subprocess.Popen:
    """``cmd`` in the background, its output appended to ``log`` after a ``$ command`` line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as f:
        f.write(f"\n$ {shlex.join(cmd)}\n{header}")
        f.flush()
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd or os.getcwd(), **popen)


class LocalRun:
    """A run as a child process of the sweep."""

    job: dict = {}  # nothing to record beyond the process: it ends with the sweep's machine

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def poll_with_peak_rss(self) -> tuple[Optional[int], Optional[int]]:
        return poll_with_peak_rss(self.proc)

    def stop(self) -> None:
        """The trainer saves a checkpoint after its current step and exits (archlab.train.faults)."""
        self.proc.send_signal(signal.SIGTERM)

    def interrupted(self) -> None:
        """Ctrl-C in the terminal reached the trainer too (one process group): nothing more to send."""

    def describe(self) -> str:
        return ""


class LocalLauncher:
    """Runs start as processes of this machine, ``--jobs`` of them at a time."""

    name = "local"

    def start(self, p, cmd: list[str], env: dict) -> LocalRun:
        """``p``: the sweep point (its ``log``)."""
        return LocalRun(start_process(cmd, env, Path(p.log)))
