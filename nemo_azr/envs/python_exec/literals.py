"""Python literals as the currency of code tasks: parsing, canonical text, strict equality, and
plausible wrong values for the warm-up.

Inputs and outputs travel as text (``repr`` of a value that :func:`ast.literal_eval` reads back);
a value counts only if ``repr`` round-trips (so ``inf``/``nan`` and objects are rejected).
"""

from __future__ import annotations

import random
from typing import Any

from nemo_azr.utils.thread_safe_ast import literal_eval

MAX_LITERAL_CHARS = 300  # inputs, outputs and answers stay short: the policy has 512 positions


class LiteralError(ValueError):
    """Text that is not a usable Python literal."""


def literal_equal(a: Any, b: Any) -> bool:
    """``a == b`` with matching types all the way down (so ``1``, ``1.0`` and ``True`` differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(literal_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(literal_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def parse_literal(text: str, *, max_chars: int = MAX_LITERAL_CHARS) -> Any:
    """The value of ``text`` (a Python literal), or :class:`LiteralError`."""
    if not isinstance(text, str):
        raise LiteralError(f"expected the literal as a string, got {type(text).__name__}")
    text = text.strip()
    if not text:
        raise LiteralError("empty literal")
    if len(text) > max_chars:
        raise LiteralError(f"literal longer than {max_chars} characters")
    try:
        value = literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise LiteralError(f"not a Python literal: {text[:60]!r} ({type(exc).__name__})") from None
    canonical(value)  # round-trip check
    return value


def canonical(value: Any) -> str:
    """``repr(value)``, checked to read back as the same value."""
    text = repr(value)
    try:
        back = literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise LiteralError(f"{text[:60]} is not a Python literal") from None
    if not literal_equal(back, value):
        raise LiteralError(f"{text[:60]} does not read back as the same value")
    return text


def perturb(value: Any, rng: random.Random) -> Any:
    """A plausible wrong value of the same kind (off by a little), never equal to ``value``."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice((-2, -1, 1, 2))
    if isinstance(value, float):
        return value + rng.choice((-1.0, 0.5, 1.0))
    if isinstance(value, str):
        if value[::-1] != value and rng.random() < 0.5:
            return value[::-1]
        return value + rng.choice("abxz")
    if isinstance(value, (list, tuple)):
        items = list(value)
        if items and rng.random() < 0.5:
            k = rng.randrange(len(items))
            items[k] = perturb(items[k], rng)
        elif items:
            items.pop()
        else:
            items.append(0)
        return type(value)(items)
    return [value]  # dict, set, None, ...: wrapping is wrong and still a literal
