"""The rollout stage of direct preference optimisation: a step's pairs are read, not generated.

Seed 004 runs class 5 (DPO and its family) on the same four stages as the RL algorithms, with empty
rollout, reward and advantage stages. This workflow turns the step's pairs (drawn by the prompt
loader as prompts are: shuffled, resumable) into the preference batch, two rows per pair, and gives
each row its label as its reward (1 chosen, 0 rejected), so the reward stage has nothing to score;
the trainer then skips the advantage stage and calls the policy's ``preference_step``.
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_azr.contracts import Batch, Role, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.task import Example, Task
from nemo_azr.tasks.preference_data import PreferencePair, example_pair, pairs_to_batch

__all__ = ["PreferencePairsWorkflow"]


class PreferencePairsWorkflow:
    """``run`` builds the step's preference batch; the generation backend is not used."""

    rows_per_prompt = 2  # a chosen and a rejected row per pair (the LR schedule counts rows)

    def __init__(self, task: Task, tokenizer, *, task_prompts: bool) -> None:
        """``task_prompts``: present each pair's prompt as ``task`` presents a question (its system
        prompt and demonstrations: pairs generated from the task); else as one user message."""
        self.task = task
        self.tokenizer = tokenizer
        self.task_prompts = task_prompts

    def _messages(self, pair: PreferencePair) -> list[dict]:
        return self.task.messages(Example(pair.id, pair.prompt, pair.chosen))

    def run(self, examples: Sequence[Example], backend, sampling, *, step: int) -> Batch:
        pairs = [example_pair(ex) for ex in examples]
        batch = pairs_to_batch(pairs, self.tokenizer, messages=self._messages if self.task_prompts else None)
        labels = batch[F.PREFERENCE_LABEL]
        batch[F.REWARDS] = labels.float()  # the reward stage's output: the label
        meta = {F.UID: [], F.GROUP_ID: [], F.PROMPT_ID: [], F.PROMPT_TEXT: [], F.RESPONSE_TEXT: []}
        for pair in pairs:
            for kind, reply in (("chosen", pair.chosen), ("rejected", pair.rejected)):
                meta[F.UID].append(f"{pair.id}-{kind}")
                meta[F.GROUP_ID].append(pair.id)
                meta[F.PROMPT_ID].append(pair.id)
                meta[F.PROMPT_TEXT].append(pair.prompt)
                meta[F.RESPONSE_TEXT].append(reply)
        meta[F.ROLE] = [Role.SOLVER.value] * len(batch)
        meta[F.SAMPLE_TYPE] = [SampleType.ANSWER.value] * len(batch)
        batch.meta.update(meta)
        return batch
