"""What a task is: a fixed list of prompts with gold answers, a chat format and a reward."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from nemo_azr.config.schema import DataConfig


@dataclass
class Example:
    """One prompt. ``prompt_id`` is stable across runs (it keys groups and logs)."""

    prompt_id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A dataset of :class:`Example` plus how to present it to the model and how to score it."""

    name: str = "task"

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        self.examples: list[Example] = []

    def messages(self, example: Example, *, instruction: str = "") -> list[dict[str, str]]:
        """Chat messages for the prompt: the system prompt joined with a workflow's output-format
        ``instruction`` (when either is set), the demonstrations, then the user's question."""
        system = "\n".join(part for part in (self.cfg.system_prompt, instruction) if part)
        messages = [{"role": "system", "content": system}] if system else []
        messages.extend({"role": m["role"], "content": m["content"]} for m in self.cfg.demonstrations)
        messages.append({"role": "user", "content": example.question})
        return messages

    @abstractmethod
    def reward(self, example: Example, response_text: str) -> float:
        """Score one response to ``example`` (must not raise on garbage text)."""

    def reference_response(self, example: Example) -> str:
        """The supervised warm-up target: by default just the gold answer."""
        return example.answer

    def __len__(self) -> int:
        return len(self.examples)
