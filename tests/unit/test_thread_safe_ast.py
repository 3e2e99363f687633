"""python_exec builds ASTs under one lock, so checking a step's proposals on threads cannot hit
CPython's shared AST recursion counter (python/cpython#106905: SystemError on 3.11.0-3.11.7)."""

from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

from nemo_azr.envs.python_exec.literals import parse_literal
from nemo_azr.envs.python_exec.programs import check_program
from nemo_azr.utils.thread_safe_ast import AST_LOCK

PROGRAM = (
    "def f(x):\n"
    + "".join(f"    y{i} = [x, {{'a': (x, {i})}}, [1, 2, 3]]\n" for i in range(12))
    + "    return x\n"
)
LITERAL = repr([{"a": (i, [i, i + 1, "sss"])} for i in range(8)])


def test_parsing_waits_for_the_lock():
    done = threading.Event()
    result: list[str] = []

    def check() -> None:
        result.append(check_program(PROGRAM))
        done.set()

    with AST_LOCK:
        worker = threading.Thread(target=check)
        worker.start()
        assert not done.wait(0.3)  # blocked: an unguarded parse finishes in microseconds
    worker.join(30)
    assert done.is_set() and result == [PROGRAM]


def test_literals_wait_for_the_lock():
    done = threading.Event()
    with AST_LOCK:
        worker = threading.Thread(target=lambda: (parse_literal("[1, (2, 'a')]"), done.set()))
        worker.start()
        assert not done.wait(0.3)
    worker.join(30)
    assert done.is_set()


def test_concurrent_checks_with_python_code_in_garbage_collection():
    """The reproduction of the CPython bug: a gc callback runs Python code, so a collection inside
    one thread's parse can hand the GIL to another parsing thread. Unguarded, this raised
    ``AST constructor recursion depth mismatch`` within a second on CPython 3.11.7."""
    errors: list[str] = []

    def work(_: int) -> None:
        for _ in range(150):
            try:
                check_program(PROGRAM)
                parse_literal(LITERAL)
            except SystemError as exc:
                errors.append(str(exc))
                return

    def busy_callback(phase: str, info: dict) -> None:
        sum(range(2000))

    gc.callbacks.append(busy_callback)
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(work, range(8)))
    finally:
        gc.callbacks.remove(busy_callback)
    assert errors == []
