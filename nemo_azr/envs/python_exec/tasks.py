"""The three Absolute-Zero code task types, their question texts, and proposal validation.

* ``deduction``: program + input shown, the solver predicts the output.
* ``abduction``: program + output shown, the solver gives an input that produces it.
* ``induction``: input/output pairs and a hint shown, the solver writes the program. The last
  pairs (at least one) stay hidden, so a lookup table of the shown pairs cannot score 1.

A task config (JSON-serialisable) holds ``type``, ``program`` and, for deduction/abduction,
``input``/``output`` (canonical literal texts), for induction ``inputs``/``outputs`` (lists),
``shown`` (how many pairs the solver sees) and ``message``; plus ``instruction``, the solver's text.
Gold outputs always come from running the program in the sandbox (twice: it must be deterministic).
"""

from __future__ import annotations

import re
from typing import Any

from nemo_azr.config.schema import SandboxLimitsConfig
from nemo_azr.envs.base import ProposalError, decode_json_at
from nemo_azr.envs.python_exec.literals import LiteralError, canonical, literal_equal, parse_literal
from nemo_azr.envs.python_exec.programs import ProgramError, check_program, run_program

TASK_TYPES = ("deduction", "abduction", "induction")
MAX_MESSAGE_CHARS = 100
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.S)
_FENCE_RE = re.compile(r"^```[a-zA-Z]*\n?|\n?```$")


def extract_answer(text: str) -> str | None:
    """The content of the first ``<answer>...</answer>`` (code fences removed), or None."""
    m = _ANSWER_RE.search(text or "")
    if m is None:
        return None
    return _FENCE_RE.sub("", m.group(1).strip()).strip()


def instruction(task: dict[str, Any]) -> str:
    """The solver's question text (compact: the whole episode must fit 512 positions)."""
    kind, program = task["type"], task["program"].rstrip()
    if kind == "deduction":
        return f"{program}\nWhat is f({task['input']})? Reply <answer>OUTPUT</answer>."
    if kind == "abduction":
        return f"{program}\nGive x with f(x) == {task['output']}. Reply <answer>INPUT</answer>."
    shown = range(task["shown"])
    pairs = "\n".join(f"f({task['inputs'][i]}) == {task['outputs'][i]}" for i in shown)
    hint = f"\nHint: {task['message']}" if task.get("message") else ""
    return f"Write def f(x) so that:\n{pairs}{hint}\nReply <answer>def f(x): ...</answer>."


def find_json_object(text: str) -> dict[str, Any]:
    """The first ``{...}`` block of ``text`` that parses as a JSON object (text around is allowed)."""
    for m in re.finditer(r"\{", text or ""):
        try:
            obj, _ = decode_json_at(text, m.start())
        except ProposalError:
            continue
        if isinstance(obj, dict):
            return obj
    raise ProposalError("no JSON object in the proposal")


def _literal(raw: Any, what: str) -> Any:
    if not isinstance(raw, str):
        raise ProposalError(f'{what} must be a string holding a Python literal, e.g. "[1, 2]"')
    try:
        return parse_literal(raw)
    except LiteralError as exc:
        raise ProposalError(f"{what}: {exc}") from None


def _gold_outputs(program: str, inputs: list[Any], limits: SandboxLimitsConfig | None) -> list[str]:
    """The program's outputs on ``inputs``; two runs must agree (deterministic programs only)."""
    runs = []
    for _ in range(2):  # checked run by run: a failing program costs one run, not two
        run = run_program(program, inputs, limits)
        runs.append(run)
        if run.violations:
            raise ProposalError(f"program did something forbidden: {'; '.join(run.violations)}")
        if not run.all_ok:
            bad = next((e for e in run.errors if e), run.status)
            raise ProposalError(f"program failed: {bad}")
    first, second = ([o for o in run.outputs if o is not None] for run in runs)
    if not all(literal_equal(parse_literal(a), parse_literal(b)) for a, b in zip(first, second)):
        raise ProposalError("program is not deterministic (two runs gave different outputs)")
    return first


def build_question(
    raw: Any,
    *,
    default_type: str,
    task_types: list[str] | tuple[str, ...],
    induction_examples: int,
    limits: SandboxLimitsConfig | None,
) -> dict[str, Any]:
    """Validate one proposed question (a JSON object) and turn it into a task config."""
    if not isinstance(raw, dict):
        raise ProposalError("each question must be a JSON object")
    kind = raw.get("type", default_type)
    if kind not in task_types:
        raise ProposalError(f"type must be one of {', '.join(task_types)}, got {kind!r}")
    if "program" not in raw:
        raise ProposalError("question without a program")
    try:
        program = check_program(raw["program"])
    except ProgramError as exc:
        raise ProposalError(str(exc)) from None
    if kind != "induction":
        if "input" not in raw:
            raise ProposalError(f"{kind} question without an input")
        value = _literal(raw["input"], "input")
        (output,) = _gold_outputs(program, [value], limits)
        task: dict[str, Any] = {"type": kind, "program": program, "input": canonical(value), "output": output}
    else:
        raw_inputs = raw.get("inputs")
        most = max(2, 2 * induction_examples)
        if not isinstance(raw_inputs, list) or not 2 <= len(raw_inputs) <= most:
            raise ProposalError(f"induction question needs an inputs list of 2 to {most} literals")
        values = [_literal(x, f"inputs[{i}]") for i, x in enumerate(raw_inputs)]
        texts = [canonical(v) for v in values]
        if len(set(texts)) != len(texts):
            raise ProposalError("induction inputs must be distinct")
        message = raw.get("message", "")
        if not isinstance(message, str) or len(message) > MAX_MESSAGE_CHARS:
            raise ProposalError(f"message must be a string of at most {MAX_MESSAGE_CHARS} characters")
        outputs = _gold_outputs(program, values, limits)
        shown = max(1, min(induction_examples, len(values) - 1))
        task = {"type": kind, "program": program, "inputs": texts, "outputs": outputs, "shown": shown,
                "message": " ".join(message.split())}  # fmt: skip
    task["instruction"] = instruction(task)
    return task
