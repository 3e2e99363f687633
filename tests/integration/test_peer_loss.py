"""Lost ranks are named, in one line from one rank, within a bounded time (parallel.timeout_s).

Three gloo processes on one machine, two "nodes" (SLURMD_NODENAME); rank 2 is killed, or stopped as
a whole (SIGSTOP: a hung node whose sockets stay open, found only by the collective timeout).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_azr.distributed.peer_loss import (
    PEER_CHECK_INTERVALS,
    first_line,
    heartbeat_interval,
    is_peer_failure,
)

WORKER = Path(__file__).with_name("peer_loss_worker.py")
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 4.0
NODES = {0: "nodeA", 1: "nodeA", 2: "nodeB"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(how: str, **extra_env: str) -> dict[int, dict]:
    port = _free_port()
    procs = {}
    for rank, node in NODES.items():
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(len(NODES)),
            RANK=str(rank),
            SLURMD_NODENAME=node,
            PEER_LOSS_VICTIM="2",
            PEER_LOSS_HOW=how,
            PEER_LOSS_TIMEOUT_S=str(TIMEOUT_S),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
            **extra_env,
        )
        procs[rank] = subprocess.Popen(
            [sys.executable, str(WORKER)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    try:
        out = {}
        for rank in (0, 1):
            stdout, stderr = procs[rank].communicate(timeout=120)
            assert procs[rank].returncode == 76, stderr[-3000:]
            out[rank] = json.loads(stdout.strip().splitlines()[-1])
        return out
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.parametrize("how", ["kill", "hang"])
def test_survivors_name_the_lost_rank_and_its_node_once(how):
    out = _run(how)
    for rank in (0, 1):
        message = out[rank]["message"]
        assert message.startswith("lost rank 2 on nodeB at step 3: "), message
        assert "newest complete checkpoint is /ckpt/step_2" in message
        assert "\n" not in message
        # a hang is found by the collective's own timeout, a killed peer by its closed connection
        assert ("Timed out" in message) == (how == "hang"), message
    assert out[0]["report"] is True and out[1]["report"] is False  # the job says it once


def test_a_survivor_that_checked_and_exited_is_not_taken_for_lost():
    """Rank 1 checks at once and exits (its beat stops); rank 0 starts its check only after that. Rank 1
    stood still during rank 0's check, but it had seen the failure itself: only rank 2 is lost."""
    late_s = PEER_CHECK_INTERVALS * heartbeat_interval(TIMEOUT_S) + 3
    out = _run("kill", PEER_LOSS_LATE_RANK="0", PEER_LOSS_LATE_S=str(late_s))
    for rank in (0, 1):
        assert out[rank]["message"].startswith("lost rank 2 on nodeB at step 3: "), out[rank]["message"]


def test_peer_failures_are_told_from_other_errors():
    gloo = RuntimeError(
        "[/w/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4431: Connection reset by peer. GLHF!"
    )
    assert is_peer_failure(gloo)
    assert first_line(gloo) == "Read error [10.0.0.2]:4431: Connection reset by peer. GLHF!"
    wrapped = ValueError("step failed")
    wrapped.__cause__ = RuntimeError("Timed out waiting 8000ms for recv operation to complete")
    assert is_peer_failure(wrapped)
    assert not is_peer_failure(RuntimeError("CUDA out of memory"))
    assert not is_peer_failure(ValueError("mat1 and mat2 shapes cannot be multiplied"))


def test_heartbeat_interval_follows_the_timeout():
    assert heartbeat_interval(600) == 10 and heartbeat_interval(20) == 2 and heartbeat_interval(3) == 1
    assert PEER_CHECK_INTERVALS * heartbeat_interval(TIMEOUT_S) < 60


#: Exits normally with a beat running; a handler registered before the beat runs after the beat's
#: own (atexit is last in, first out) and reports whether the thread still lives at finalization.
_CLEAN_EXIT = """
import atexit, threading
from datetime import timedelta
import torch.distributed as dist
from nemo_azr.distributed.peer_loss import Heartbeat

atexit.register(lambda: print("alive at exit:", any(t.name == "nemo-azr-heartbeat" for t in threading.enumerate())))
store = dist.TCPStore("127.0.0.1", {port}, is_master=True, timeout=timedelta(seconds=5))
beat = Heartbeat(store, 0, 1, "127.0.0.1:{port}", 5.0)
beat.start()
print("beating")
"""


def test_the_heartbeat_thread_is_joined_before_the_interpreter_finalizes():
    """A daemon thread caught in a store call at finalization aborts the process (status 134) after
    a completed run; the beat stops and joins at exit instead."""
    r = subprocess.run(
        [sys.executable, "-c", _CLEAN_EXIT.format(port=_free_port())],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines() == ["beating", "alive at exit: False"], r.stdout
