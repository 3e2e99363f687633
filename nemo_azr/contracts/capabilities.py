"""Optional capabilities of components, as runtime-checkable Protocols (checked with ``isinstance``)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HeldOutSelfPlaySet(Protocol):
    """A self-play domain with a fixed held-out set (``nemo-azr eval`` of an ``azr`` run).

    ``heldout_seeds()``: seed tasks (``Example``) never used in training, for the proposer's
    held-out parse rate and learnable ratio. ``heldout_tasks()``: solver task configs the
    domain's environment runs as they are, each with a ``task_id`` and a ``kind``.
    """

    def heldout_seeds(self) -> list[Any]: ...

    def heldout_tasks(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class ExplainsRewards(Protocol):
    """A task that can say why a reply earned no answer.

    ``answer_rejection(example, response_text)``: "" when the reply's answer was read (right or
    wrong), else why none was (one of ``rejection_reasons()``, e.g. ``several_candidates``). The
    reward itself stays ``reward()``; the reward stage counts the reasons per step as
    ``reward/answer_<reason>``.
    """

    def answer_rejection(self, example: Any, response_text: str) -> str: ...

    def rejection_reasons(self) -> tuple[str, ...]: ...


@runtime_checkable
class RephrasedEvalSet(Protocol):
    """A task that can re-ask its held-out questions in phrasings never used in training
    (``nemo-azr eval`` scores both: does what was learned survive a rephrasing?).

    ``rephrased(examples)``: the same problems and gold answers in other words, each with
    ``meta["template"]`` naming its phrasing.
    """

    def rephrased(self, examples: list[Any]) -> list[Any]: ...
