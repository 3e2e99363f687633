"""``ast.parse`` and ``ast.literal_eval`` that are safe to call from several threads at once.

CPython 3.11.0-3.11.7 and 3.12.0-3.12.1 keep the counter that checks the AST constructor's recursion
in one place per interpreter (python/cpython#106905, fixed in 3.11.8 and 3.12.2). When two threads
build ASTs at once (a garbage collection inside one parse can run Python code, a ``__del__`` or a
``gc`` callback, and hand the GIL to the other), the counter goes off and the parse raises
``SystemError: AST constructor recursion depth mismatch``. The python_exec domain checks a step's
proposals on a thread pool (:mod:`nemo_azr.envs.python_exec.pool`), so it parses under one lock:
a parse takes microseconds, the sandbox runs around it take the time.
"""

from __future__ import annotations

import ast
import threading
from typing import Any

#: Held while an AST is built; the sandbox's child processes run outside it.
AST_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)`` under :data:`AST_LOCK`."""
    with AST_LOCK:
        return ast.parse(source, mode=mode)


def literal_eval(text: str) -> Any:
    """``ast.literal_eval(text)`` under :data:`AST_LOCK`."""
    with AST_LOCK:
        return ast.literal_eval(text)
