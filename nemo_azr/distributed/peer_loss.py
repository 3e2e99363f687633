"""Lost peers: when a collective fails, which ranks (on which nodes) stopped, in one line.

A failed collective only says that a connection broke ("Connection reset by peer") or that it timed
out (``parallel.timeout_s``); it does not say which rank is gone, and on a 2-node job the survivors
would otherwise print several tracebacks each. Every rank bumps a counter of its own in the
rendezvous store (the TCPStore at ``MASTER_ADDR:MASTER_PORT``, which outlives a lost node unless it
is rank 0's) from a daemon thread, every ``heartbeat_interval`` seconds. After a collective fails, a
survivor reads all counters, waits three intervals and reads them again: the ranks whose counters
did not move are lost (a killed process, a node gone, a process hung as a whole). Counters need no
clock shared between nodes. A thread still beats while its main thread waits inside a collective, so
a survivor stuck behind another survivor is not taken for lost.

Written by hand: torch.distributed has no liveness query, and torchelastic's agent heartbeats are
for its own rendezvous (not visible to the workers, and absent under srun).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

import torch.distributed as dist

from nemo_azr.errors import PeerLostError

__all__ = [
    "Heartbeat",
    "heartbeat_interval",
    "is_peer_failure",
    "node_name",
    "peer_lost_error",
    "start_heartbeat",
    "stop_heartbeat",
]

_KEY = "nemo_azr/heartbeat/{rank}"
_NODE_KEY = "nemo_azr/node/{rank}"
_DONE_KEY = "nemo_azr/peer_check_done"
#: Set by each rank as it starts its check: a survivor that has checked and exited stops beating, and
#: must not be taken for lost by a slower survivor whose check begins after that.
_SURVIVOR_KEY = "nemo_azr/survivor/{rank}"
#: What gloo and NCCL say when a peer is gone or silent (torch raises them as RuntimeError or
#: DistBackendError, whose text is all there is to go on).
_PEER_FAILURE = re.compile(
    r"connection (?:reset|closed|refused)|broken pipe|timed out|timeout|read error|write error|"
    r"no route to host|socket closed|ncclremoteerror|ncclsystemerror|remote process exited|"
    r"watchdog caught collective operation",
    re.IGNORECASE,
)
PEER_CHECK_INTERVALS = 3  # a counter still after this many intervals belongs to a lost rank


def heartbeat_interval(timeout_s: float) -> float:
    """Seconds between beats: a tenth of the collective timeout, between 1 and 10 s."""
    return min(10.0, max(1.0, timeout_s / 10))


def node_name() -> str:
    """The node this process runs on, as Slurm names it (several nodes may share one host)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it came from) is a collective that lost its peer."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, dist.DistError) or (
            isinstance(exc, RuntimeError) and _PEER_FAILURE.search(str(exc))
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


@dataclass
class Heartbeat:
    """This rank's beat (a daemon thread) and what it needs to judge the others'."""

    store: dist.Store
    rank: int
    world: int
    address: str
    timeout_s: float
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def interval_s(self) -> float:
        return heartbeat_interval(self.timeout_s)

    def start(self) -> None:
        self.store.set(_NODE_KEY.format(rank=self.rank), node_name())
        self._thread = threading.Thread(target=self._beat, name="nemo-azr-heartbeat", daemon=True)
        self._thread.start()
        # A daemon thread still inside a store call when the interpreter finalizes cannot take the GIL
        # back; the thread is unwound through C++ frames and the process aborts ("terminate called
        # without an active exception", status 134) after a run that completed. Joined at exit instead.
        atexit.register(self.stop)

    def _beat(self) -> None:
        key = _KEY.format(rank=self.rank)
        while not self._stop.is_set():
            try:
                self.store.add(key, 1)
            except Exception:  # noqa: BLE001 - the store's host is gone: nothing left to beat to
                return
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """End the beat and wait for the thread (a store call in flight ends within the store's
        timeout; the wait is bounded by it)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.timeout_s + self.interval_s)

    def counters(self) -> list[int]:
        return [self.store.add(_KEY.format(rank=r), 0) for r in range(self.world)]

    def lost_ranks(self) -> list[int]:
        """Ranks whose counters stood still for :data:`PEER_CHECK_INTERVALS` intervals and that
        never started a check of their own (one that did saw the failure too: it is a survivor,
        perhaps one that has exited since)."""
        self.store.set(_SURVIVOR_KEY.format(rank=self.rank), "1")
        before = self.counters()
        time.sleep(PEER_CHECK_INTERVALS * self.interval_s)
        after = self.counters()
        still = [r for r in range(self.world) if r != self.rank and after[r] == before[r]]
        return [r for r in still if not self.store.check([_SURVIVOR_KEY.format(rank=r)])]

    def done_checking(self, survivors: list[int]) -> None:
        """Count this rank's check as done; rank 0, whose process hosts the store when srun starts
        the ranks, stays until every survivor has checked (one stuck in a collective with a survivor
        checks only after ``timeout_s``), so none of them takes the store's end for a lost node."""
        self.store.add(_DONE_KEY, 1)
        if self.rank != 0:
            return
        deadline = time.monotonic() + self.timeout_s + 2 * PEER_CHECK_INTERVALS * self.interval_s
        while self.store.add(_DONE_KEY, 0) < len(survivors) and time.monotonic() < deadline:
            time.sleep(0.2)

    def node_of(self, rank: int) -> str:
        key = _NODE_KEY.format(rank=rank)
        with contextlib.suppress(Exception):
            if self.store.check([key]):
                return self.store.get(key).decode()
        return "an unknown node"


_HEARTBEAT: Heartbeat | None = None


def start_heartbeat(timeout_s: float) -> Heartbeat | None:
    """Start this rank's beat (once per process, multi-process runs launched with MASTER_ADDR/PORT)."""
    global _HEARTBEAT
    if _HEARTBEAT is not None or not dist.is_initialized() or dist.get_world_size() == 1:
        return _HEARTBEAT
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    # A client connection of its own: the beat must not share a socket with the process group's calls.
    store = dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    beat = Heartbeat(
        store,
        dist.get_rank(),
        dist.get_world_size(),
        f"{addr}:{port}",
        timeout_s,
    )
    beat.start()
    _HEARTBEAT = beat
    return beat


def stop_heartbeat() -> None:
    global _HEARTBEAT
    if _HEARTBEAT is not None:
        _HEARTBEAT.stop()
        _HEARTBEAT = None


def first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    # gloo prefixes the source file ("[/path/gloo/transport/tcp/pair.cc:537] Read error ...")
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)[:300]


def _ranks_on_nodes(beat: Heartbeat, ranks: list[int]) -> str:
    by_node: dict[str, list[int]] = {}
    for r in ranks:
        by_node.setdefault(beat.node_of(r), []).append(r)
    parts = []
    for node, rs in by_node.items():
        word = "rank" if len(rs) == 1 else "ranks"
        parts.append(f"{word} {', '.join(map(str, rs))} on {node}")
    return "; ".join(parts)


def peer_lost_error(exc: BaseException, *, step: int, checkpoint: str | None) -> PeerLostError | None:
    """The one-line error for a collective whose peers are gone, or None when ``exc`` is something
    else (or every rank still beats: then it is no lost peer, and the original error stands).

    Blocks for :data:`PEER_CHECK_INTERVALS` heartbeat intervals. ``PeerLostError.report`` is True on
    the lowest surviving rank only, so a job prints the line once.
    """
    beat = _HEARTBEAT
    if beat is None or not is_peer_failure(exc):
        return None
    kept = f"the newest complete checkpoint is {checkpoint}" if checkpoint else "no checkpoint yet"
    cause = first_line(exc)
    try:
        lost = beat.lost_ranks()
    except Exception as store_exc:  # noqa: BLE001 - the store's host (rank 0's node) is gone
        return PeerLostError(
            f"rank {beat.rank} on {node_name()}: lost the rendezvous store at {beat.address} "
            f"(rank 0's node) at step {step} ({cause}; then {first_line(store_exc)}); {kept}",
            report=True,
        )
    if not lost:
        return None
    survivors = [r for r in range(beat.world) if r not in lost]
    where = _ranks_on_nodes(beat, lost)
    with contextlib.suppress(Exception):  # the store may go now: the finding stands
        beat.done_checking(survivors)
    return PeerLostError(
        f"lost {where} at step {step}: no heartbeat for "
        f"{PEER_CHECK_INTERVALS * beat.interval_s:g} s after a collective failed on rank {beat.rank} "
        f"({cause}); {kept}",
        report=beat.rank == min(survivors),
    )
