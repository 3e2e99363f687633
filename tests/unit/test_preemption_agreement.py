"""Ranks agree on a preemption stop by the reduced signal, never by their own flag.

A two-rank world is simulated by a reduce that takes the peer's contribution: the race that stopped
one rank alone (its handler ran while the collective was in flight, after its 0 was contributed)
is played out deterministically."""

from __future__ import annotations

import signal

from nemo_azr.trainer.preemption import PreemptionFlag, agree_on_signal


def _reduce_with_peer(peer: int, *, deliver_during: PreemptionFlag | None = None):
    """MAX over this rank's value and the peer's; ``deliver_during`` gets SIGUSR1 after the values
    were exchanged (the handler runs when the collective returns)."""

    def all_reduce_max(value: int) -> int:
        result = max(value, peer)
        if deliver_during is not None:
            deliver_during._handle(signal.SIGUSR1, None)
        return result

    return all_reduce_max


def test_a_signal_landing_during_the_collective_waits_for_the_next_check():
    flag = PreemptionFlag()
    flag.enter("training", interruptible=False)
    # The peer contributed 0 and will stop only if this rank does the same: both must say "go on".
    assert agree_on_signal(flag, _reduce_with_peer(0, deliver_during=flag)) is False
    assert flag.requested  # recorded locally ...
    # ... and contributed at the next check, where the peer sees it too.
    peer_view = PreemptionFlag()
    assert agree_on_signal(peer_view, _reduce_with_peer(int(flag.signum))) is True
    assert agree_on_signal(flag, _reduce_with_peer(0)) is True


def test_a_peer_signal_stops_this_rank_and_is_named():
    flag = PreemptionFlag()
    flag.enter("training", interruptible=False)
    assert agree_on_signal(flag, _reduce_with_peer(int(signal.SIGTERM))) is True
    assert flag.signum == signal.SIGTERM
    assert flag.describe() == "SIGTERM during training"


def test_no_signal_anywhere_goes_on():
    flag = PreemptionFlag()
    assert agree_on_signal(flag, _reduce_with_peer(0)) is False
    assert not flag.requested
