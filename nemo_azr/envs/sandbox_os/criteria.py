"""Success criteria of a ``sandbox_os`` task: predicates on the final world, split with :mod:`shlex`.

Grammar (``TEXT`` may be quoted or run to the end of the string; matching is case-sensitive for file
text and case-insensitive for addresses)::

    exists P | missing P | contains F TEXT | sent TO | sent_contains TO TEXT

``exists``/``missing``: a file or folder is / is not there. ``contains``: file ``F`` holds ``TEXT``.
``sent``: some sent mail went to ``TO``. ``sent_contains``: some mail to ``TO`` holds ``TEXT`` in its
subject or body.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from nemo_azr.envs.sandbox_os.actions import ADDRESS_RE
from nemo_azr.envs.sandbox_os.world import PathError, World, normalize_path

# kind -> (first argument is a path (else an address), a TEXT argument follows)
_KINDS: dict[str, tuple[bool, bool]] = {
    "exists": (True, False),
    "missing": (True, False),
    "contains": (True, True),
    "sent": (False, False),
    "sent_contains": (False, True),
}


class CriterionError(ValueError):
    """A string that is not a well-formed criterion."""


@dataclass(frozen=True)
class Criterion:
    kind: str
    subject: str  # a normalised path, or a lower-case address
    text: str = ""

    def line(self) -> str:
        parts = [self.kind, shlex.quote(self.subject)]
        if _KINDS[self.kind][1]:
            parts.append(shlex.quote(self.text))
        return " ".join(parts)

    def holds(self, world: World) -> bool:
        if self.kind == "exists":
            return world.exists(self.subject)
        if self.kind == "missing":
            return not world.exists(self.subject)
        if self.kind == "contains":
            return world.is_file(self.subject) and self.text in world.files[self.subject]
        mails = [m for m in world.outbox if m.to == self.subject]
        if self.kind == "sent":
            return bool(mails)
        return any(self.text in m.subject or self.text in m.body for m in mails)


def parse_criterion(text: str) -> Criterion:
    """Parse one criterion string; raises :class:`CriterionError`."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise CriterionError(f"bad quoting in {text!r}: {exc}") from None
    kind = tokens[0].lower() if tokens else ""
    if kind not in _KINDS:
        raise CriterionError(f"unknown criterion {text[:30]!r} (use {', '.join(_KINDS)})")
    is_path, has_text = _KINDS[kind]
    args = tokens[1:]
    if len(args) < 1 + has_text or (not has_text and len(args) > 1):
        raise CriterionError(f"usage: {kind} {'PATH' if is_path else 'TO'}{' TEXT' if has_text else ''}")
    rest = " ".join(args[1:])
    if is_path:
        try:
            path = normalize_path(args[0])
        except PathError as exc:
            raise CriterionError(str(exc)) from None
        if not path:
            raise CriterionError(f"{kind} needs a path inside home, not home itself")
        return Criterion(kind, path, rest)
    address = args[0].lower()
    if not ADDRESS_RE.fullmatch(address):
        raise CriterionError(f"not a mail address: {args[0]!r}")
    return Criterion(kind, address, rest)


def completion(criteria: list[Criterion], world: World) -> float:
    """Share of ``criteria`` that hold in ``world`` (0.0 for none)."""
    return sum(c.holds(world) for c in criteria) / len(criteria) if criteria else 0.0
