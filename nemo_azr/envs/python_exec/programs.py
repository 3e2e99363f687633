"""Programs of code tasks: ``def f(x): ...`` checked with :mod:`ast`, run in the sandbox on inputs.

:func:`run_program` appends a small driver to the program that calls ``f`` on each input (inputs are
embedded as canonical literals) and prints one ``@@AZR@@ <index> <repr>`` line per call, or
``@@AZR@@ <index> !<ExceptionName>`` when the call raised. An exception in one call fails only that
input. The program can print too (ignored) or fake marker lines, but it cannot learn the gold
outputs, which never enter the sandbox; an index reported twice counts as failed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from nemo_azr.config.schema import SandboxLimitsConfig
from nemo_azr.envs.python_exec.literals import LiteralError, canonical, parse_literal
from nemo_azr.envs.python_exec.sandbox import run_python
from nemo_azr.utils import thread_safe_ast

MAX_PROGRAM_CHARS = 1000
MARKER = "@@AZR@@"
_DRIVER = """

def _azr_main(inputs):
    import sys
    out = sys.stdout
    for i, x in enumerate(inputs):
        try:
            r = repr(f(x))
        except BaseException as e:  # one failing input must not hide the others
            r = "!" + type(e).__name__
        out.write("\\n{marker} %d %s\\n" % (i, r.replace("\\n", " ")))
        out.flush()


_azr_main([{inputs}])
"""


class ProgramError(ValueError):
    """Text that is not a valid task program."""


def check_program(text: str) -> str:
    """The program (stripped, newline-terminated) if it parses and defines ``f`` with exactly one
    positional parameter at top level; :class:`ProgramError` otherwise."""
    if not isinstance(text, str):
        raise ProgramError(f"program must be a string, got {type(text).__name__}")
    text = text.strip("\n").rstrip()
    if not text.strip():
        raise ProgramError("empty program")
    if len(text) > MAX_PROGRAM_CHARS:
        raise ProgramError(f"program longer than {MAX_PROGRAM_CHARS} characters")
    try:
        tree = thread_safe_ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise ProgramError(f"program does not parse: {exc}") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "f"]
    if not defs:
        raise ProgramError("program does not define f at top level")
    a = defs[-1].args
    if len(a.posonlyargs) + len(a.args) != 1 or a.vararg or a.kwarg or a.kwonlyargs:
        raise ProgramError("f must take exactly one positional argument")
    return text + "\n"


@dataclass
class ProgramRun:
    """Per-input results of one sandbox run: ``outputs[i]`` is the canonical literal of
    ``f(inputs[i])``, or None with the reason in ``errors[i]``."""

    status: str  # the sandbox status
    outputs: list[str | None]
    errors: list[str | None]
    violations: list[str] = field(default_factory=list)
    stderr: str = ""

    @property
    def all_ok(self) -> bool:
        return self.status == "ok" and all(o is not None for o in self.outputs)


def run_program(program: str, inputs: list[Any], limits: SandboxLimitsConfig | None = None) -> ProgramRun:
    """Run checked ``program`` on each input value in one sandboxed process."""
    args = ", ".join(canonical(x) for x in inputs)
    result = run_python(program + _DRIVER.format(marker=MARKER, inputs=args), limits=limits)
    seen: dict[int, list[str]] = {}
    for line in result.stdout.splitlines():
        if line.startswith(MARKER + " "):
            index, _, text = line[len(MARKER) + 1 :].partition(" ")
            if index.isdigit():
                seen.setdefault(int(index), []).append(text)
    outputs: list[str | None] = []
    errors: list[str | None] = []
    for i in range(len(inputs)):
        texts = seen.get(i, [])
        out, err = None, None
        if result.status != "ok":
            err = f"sandbox: {result.status}"
        elif len(texts) != 1:
            err = "no result" if not texts else "result reported twice"
        elif texts[0].startswith("!"):
            err = f"raised {texts[0][1:]}"
        else:
            try:
                out = canonical(parse_literal(texts[0]))
            except LiteralError as exc:
                err = f"output: {exc}"
        outputs.append(out)
        errors.append(err)
    return ProgramRun(result.status, outputs, errors, list(result.violations), result.stderr[-500:])
