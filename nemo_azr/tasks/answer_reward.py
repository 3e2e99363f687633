"""The reward of tasks whose replies state one answer to a gold: the accuracy reader, with the reason
a reply earned no answer (the ``ExplainsRewards`` capability the reward stage counts)."""

from __future__ import annotations

from nemo_azr.contracts.task import Example
from nemo_azr.rewards.accuracy import accuracy_with_reason
from nemo_azr.rewards.answer_extraction import REJECTIONS


class AnswerReward:
    """Mixin for a :class:`~nemo_azr.contracts.task.Task`: ``reward`` and ``answer_rejection`` from one
    reading of the reply (the question lets a reply that restates its expression be read)."""

    def reward(self, example: Example, response_text: str) -> float:
        return self.reward_with_reason(example, response_text)[0]

    def answer_rejection(self, example: Example, response_text: str) -> str:
        return self.reward_with_reason(example, response_text)[1]

    def reward_with_reason(self, example: Example, response_text: str) -> tuple[float, str]:
        return accuracy_with_reason(example.answer, response_text, example.question)

    def rejection_reasons(self) -> tuple[str, ...]:
        return REJECTIONS
