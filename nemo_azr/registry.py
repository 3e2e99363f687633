"""A small generic name -> callable registry.

Estimators, losses, reward functions, environments and backends register themselves with a
decorator, so adding one is one function in one file; the trainer looks them up by the string in
the config. An unknown name is a :class:`ConfigError` that lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from nemo_azr.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to objects of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: ``@ADVANTAGE_ESTIMATORS.register("grpo")``."""

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                if key in self._entries and self._entries[key] is not obj:
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
                self._entries[key] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "(none registered)"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")
POLICY_LOSSES: Registry = Registry("policy loss")
PREFERENCE_LOSSES: Registry = Registry("preference loss")
REWARD_FUNCTIONS: Registry = Registry("reward function")
ENVIRONMENTS: Registry = Registry("environment")
GENERATION_BACKENDS: Registry = Registry("generation backend")
POLICY_BACKENDS: Registry = Registry("policy backend")
CRITIC_BACKENDS: Registry = Registry("critic backend")
TASKS: Registry = Registry("task")
WORKFLOWS: Registry = Registry("rollout workflow")
