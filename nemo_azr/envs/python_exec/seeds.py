"""Built-in seed programs of ``python_exec``: small templates whose constants the warm-up varies.

Each :class:`SeedProgram` is a program text with ``{a}`` (and maybe ``{b}``) placeholders, the
ranges of those constants, a sampler of inputs and a short induction hint. Programs are kept tiny
(ints, lists, strings) so a question plus its answer fits the tiny policy's 512 positions.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_WORDS = ("cat", "door", "apple", "sun", "river", "code", "moon", "tree")


def _int(rng: random.Random) -> int:
    return rng.randint(0, 9)


def _ints(rng: random.Random) -> list[int]:
    return [rng.randint(0, 9) for _ in range(rng.randint(2, 4))]


def _word(rng: random.Random) -> str:
    return rng.choice(_WORDS)


@dataclass(frozen=True)
class SeedProgram:
    template: str  # uses {a} and optionally {b}
    a: tuple[int, int]  # inclusive range of the constant a
    b: tuple[int, int]  # inclusive range of b (unused when the template has no {b})
    sample_input: Callable[[random.Random], Any]
    hint: str  # the induction message
    default: tuple[int, int]  # (a, b) of the seed task itself

    def program(self, a: int, b: int) -> str:
        return self.template.format(a=a, b=b)

    def sample_program(self, rng: random.Random) -> str:
        return self.program(rng.randint(*self.a), rng.randint(*self.b))


SEED_PROGRAMS: tuple[SeedProgram, ...] = (
    SeedProgram("def f(x):\n    return x * {a} + {b}", (2, 5), (0, 9), _int, "multiply, then add", (3, 1)),
    SeedProgram(
        "def f(x):\n    return [v + {a} for v in x]", (1, 9), (0, 0), _ints, "add to each item", (2, 0)
    ),
    SeedProgram("def f(x):\n    return x[::-1] * {a}", (1, 2), (0, 0), _word, "reverse, repeat", (2, 0)),
    SeedProgram(
        "def f(x):\n    return sum(v for v in x if v % {a} == 0)",
        (2, 3),
        (0, 0),
        _ints,
        "sum of multiples",
        (2, 0),
    ),
    SeedProgram(
        "def f(x):\n    return len(x) * {a} - {b}", (2, 4), (0, 3), _word, "length times a, minus b", (2, 1)
    ),
    SeedProgram("def f(x):\n    return sorted(x)[:{a}]", (1, 3), (0, 0), _ints, "smallest items", (2, 0)),
    SeedProgram(
        "def f(x):\n    return x[:{a}].upper() + x[{a}:]",
        (1, 3),
        (0, 0),
        _word,
        "upper-case the start",
        (1, 0),
    ),
    SeedProgram("def f(x):\n    return max(x) - min(x) + {a}", (0, 5), (0, 0), _ints, "range plus a", (1, 0)),
)
