"""Arithmetic drill: "What is 3 + 5?" -> "8", over every operand pair in a small range."""

from __future__ import annotations

import itertools
import json
import operator
import random
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts.task import Example, Task
from nemo_azr.errors import ConfigError
from nemo_azr.registry import TASKS
from nemo_azr.tasks.answer_reward import AnswerReward

OPERATIONS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
}
KINDS = {"+": "addition", "-": "subtraction", "*": "multiplication"}  # Example.meta["kind"]: per-kind eval
DEFAULT_SUBSET_SEED = 0  # DataConfig has no seed; the subset only has to be the same every run
REPHRASINGS = Path(__file__).with_name("data") / "arithmetic_rephrasings.json"


@cache
def rephrasing_templates() -> dict[str, list[str]]:
    """The held-out phrasings per operation (committed data; never used in training)."""
    data = json.loads(REPHRASINGS.read_text())
    return {op: list(data[op]) for op in OPERATIONS}


@TASKS.register("arithmetic")
class ArithmeticTask(AnswerReward, Task):
    """Every ``(a, op, b)`` in range, or a seeded subset of ``num_problems`` of them."""

    name = "arithmetic"

    def __init__(self, cfg: DataConfig, *, seed: int = DEFAULT_SUBSET_SEED) -> None:
        super().__init__(cfg)
        arith = cfg.arithmetic
        operations = _validate_operations(list(arith.operations))
        if arith.min_operand > arith.max_operand:
            raise ConfigError(
                f"data.arithmetic.min_operand ({arith.min_operand}) must be <= "
                f"max_operand ({arith.max_operand})"
            )
        operands = range(arith.min_operand, arith.max_operand + 1)
        problems = list(itertools.product(operands, operations, operands))
        if arith.nonnegative:
            problems = [(a, op, b) for a, op, b in problems if OPERATIONS[op](a, b) >= 0]
        if arith.num_problems < 0 or arith.num_problems > len(problems):
            raise ConfigError(
                f"data.arithmetic.num_problems must be in [0, {len(problems)}] (0 = all), "
                f"got {arith.num_problems}"
            )
        if arith.num_problems:
            keep = sorted(random.Random(seed).sample(range(len(problems)), arith.num_problems))
            problems = [problems[i] for i in keep]
        template = _validate_template(arith.question_template)
        self.examples = [_example(a, op, b, template) for a, op, b in problems]

    def rephrased(self, examples: Sequence[Example]) -> list[Example]:
        """``examples`` asked in the held-out phrasings: example ``i`` of an operation in its
        ``i``-th template (cycling), so every template is used and the set is the same every run."""
        templates = rephrasing_templates()
        out, seen = [], dict.fromkeys(OPERATIONS, 0)
        for ex in examples:
            a, op, b = ex.meta["a"], ex.meta["op"], ex.meta["b"]
            k = seen[op] % len(templates[op])
            seen[op] += 1
            meta = {**ex.meta, "template": k}
            out.append(Example(f"{ex.prompt_id}-r{k}", templates[op][k].format(a=a, b=b), ex.answer, meta))
        return out


def _validate_operations(operations: list[str]) -> list[str]:
    if not operations:
        raise ConfigError(f"data.arithmetic.operations is empty; use some of {list(OPERATIONS)}")
    unknown = [op for op in operations if op not in OPERATIONS]
    if unknown:
        raise ConfigError(f"data.arithmetic.operations has unknown {unknown}; known: {list(OPERATIONS)}")
    return list(dict.fromkeys(operations))  # drop duplicates, keep order


def _validate_template(template: str) -> str:
    try:
        template.format(a=1, op="+", b=2)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(
            f"data.arithmetic.question_template={template!r} is not a format string over {{a}}, {{op}}, {{b}} "
            f"({type(exc).__name__}: {exc})"
        ) from None
    if not all(f"{{{name}}}" in template for name in ("a", "op", "b")):
        raise ConfigError(
            f"data.arithmetic.question_template={template!r} must contain {{a}}, {{op}} and {{b}}"
        )
    return template


def _example(a: int, op: str, b: int, template: str) -> Example:
    result = OPERATIONS[op](a, b)
    return Example(
        prompt_id=f"arith-{a}{op}{b}",
        question=template.format(a=a, op=op, b=b),
        answer=str(result),
        meta={"a": a, "op": op, "b": b, "kind": KINDS[op]},
    )
