"""Stop signals: the flag, the message from rank 0 only, the handler found restored."""

import signal

import pytest

from archlab.train.faults import StopSignal


@pytest.mark.parametrize("announce", [True, False])
def test_only_the_announcing_rank_prints_the_signal_message(capsys, announce):
    found = signal.getsignal(signal.SIGTERM)
    stop = StopSignal(announce=announce)
    signal.raise_signal(signal.SIGTERM)
    assert stop.requested and stop.received == "SIGTERM"
    err = capsys.readouterr().err
    assert ("SIGTERM received" in err) is announce
    assert signal.getsignal(signal.SIGTERM) is found  # the first signal hands back the handler it found


def test_an_ignored_sigint_stays_ignored_after_close():
    """A background shell starts Python with SIGINT ignored: closing restores SIG_IGN, not the default."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        StopSignal().close()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
