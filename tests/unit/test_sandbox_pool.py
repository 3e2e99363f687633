"""Concurrent sandbox runs: the bound on running sandboxes, ordered results, the sandbox clock."""

import threading
import time

import pytest

from nemo_azr.config.schema import SandboxLimitsConfig
from nemo_azr.envs.python_exec.pool import LIMITER, SandboxLimiter, map_ordered
from nemo_azr.envs.python_exec.programs import run_program


def test_the_limiter_never_lets_more_than_limit_runs_in():
    limiter = SandboxLimiter(2)
    barrier = threading.Barrier(2, timeout=30)  # the two holders of the slots must meet inside
    lock = threading.Lock()
    active, peak = [0], [0]

    def run(_):
        with limiter.slot():
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            barrier.wait()  # a third run inside would break this barrier's pairing
            with lock:
                active[0] -= 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert peak[0] == 2


def test_map_ordered_keeps_the_input_order_and_raises_the_first_error_in_order():
    def slow_first(x):
        if x == 0:
            time.sleep(0.05)  # finishes last, still comes first
        return x * 10

    assert map_ordered(slow_first, range(5)) == [0, 10, 20, 30, 40]

    def fail(x):
        if x in (1, 3):
            raise ValueError(f"bad {x}")
        return x

    with pytest.raises(ValueError, match="bad 1"):
        map_ordered(fail, range(5))


def test_the_clock_counts_time_with_a_sandbox_running():
    limiter = SandboxLimiter(1)
    assert limiter.seconds() == 0.0
    with limiter.slot():
        time.sleep(0.05)
    assert limiter.seconds() >= 0.05
    idle = limiter.seconds()
    time.sleep(0.02)
    assert limiter.seconds() == idle  # nothing ran meanwhile


def test_concurrent_runs_give_the_sequential_results():
    programs = [f"def f(x):\n    return x * {k}\n" for k in range(6)] + ["def f(x):\n    return 1 / 0\n"]
    limits = SandboxLimitsConfig()
    LIMITER.configure(1)
    try:
        sequential = [run_program(p, [3, 4], limits) for p in programs]
    finally:
        LIMITER.configure(0)
    concurrent = map_ordered(lambda p: run_program(p, [3, 4], limits), programs)
    assert [(r.status, r.outputs, r.errors) for r in concurrent] == [
        (r.status, r.outputs, r.errors) for r in sequential
    ]
    assert concurrent[2].outputs == ["6", "8"] and concurrent[-1].status == "ok"
    assert concurrent[-1].errors[0].startswith("raised ZeroDivisionError")


def test_a_bad_bound_is_refused():
    with pytest.raises(ValueError, match="max_concurrent_runs must be >= 0"):
        SandboxLimiter().configure(-1)
