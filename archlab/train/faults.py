"""Faults the training loop reacts to: stop signals and non-finite numbers."""

from __future__ import annotations

import signal
import sys
from typing import Optional


class NonFiniteError(RuntimeError):
    """The loss or the gradient norm stopped being finite; the weights were not updated."""


class StopSignal:
    """Turns SIGINT/SIGTERM into a flag the loop checks between steps (save, then exit). Under several
    processes the flag rides the step's own all-reduce (``Trainer.train_step``), so every rank stops
    after the same step: the step whose reduction saw it on some rank (a signal that arrives after
    the reduction stops the run one step later).

    A second signal while stopping falls back to the default behaviour, so a user can still
    force an exit. Handlers are restored on ``close``. Only the main thread can install them.
    ``announce``: print the message when a signal arrives (rank 0 only: every rank gets the signal).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, announce: bool = True) -> None:
        self.received: Optional[str] = None
        self.announce = announce
        self._previous = {}
        for sig in self.SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: no handler, no graceful stop
                pass

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        if self.announce:
            print(f"\n[archlab] {self.received} received: finishing this step, saving a checkpoint, then exiting "
                  "(send it again to exit at once)", file=sys.stderr, flush=True)
        self.close()  # a second signal gets the previous (default) behaviour

    @property
    def requested(self) -> bool:
        return self.received is not None

    def close(self) -> None:
        for sig, prev in self._previous.items():
            try:
                signal.signal(sig, prev if prev is not None else signal.SIG_DFL)
            except (ValueError, TypeError):
                pass
        self._previous = {}
