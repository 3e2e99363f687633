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
