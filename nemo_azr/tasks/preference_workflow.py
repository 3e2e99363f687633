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
from nemo_azr.tasks.preference_data import (
    PreferencePair,
    example_pair,
    example_reply,
    mismatched_partners,
    pairs_to_batch,
    unpaired_to_batch,
)

__all__ = ["PreferencePairsWorkflow"]


class PreferencePairsWorkflow:
    """``run`` builds the step's preference batch; the generation backend is not used."""

    rows_per_prompt = 2  # a chosen and a rejected row per pair (the LR schedule counts rows)

    def __init__(self, task: Task, tokenizer, *, task_prompts: bool, kl_rows: bool = False) -> None:
        """``task_prompts``: present each pair's prompt as ``task`` presents a question (its system
        prompt and demonstrations: pairs generated from the task); else as one user message.
        ``kl_rows`` (KTO): the batch also holds a mismatched row per row (``pairs_to_batch``)."""
        self.task = task
        self.tokenizer = tokenizer
        self.task_prompts = task_prompts
        self.kl_rows = kl_rows
        if kl_rows:
            self.rows_per_prompt = 4  # a pair's two rows and their two mismatched rows (unpaired: fewer)

    def _messages(self, pair: PreferencePair) -> list[dict]:
        return self.task.messages(Example(pair.id, pair.prompt, pair.chosen))

    def run(self, examples: Sequence[Example], backend, sampling, *, step: int) -> Batch:
        meta: dict[str, list] = {
            F.UID: [],
            F.GROUP_ID: [],
            F.PROMPT_ID: [],
            F.PROMPT_TEXT: [],
            F.RESPONSE_TEXT: [],
        }

        def add(uid: str, group: str, prompt: str, reply: str) -> None:
            for key, value in zip(meta, (uid, group, group, prompt, reply)):
                meta[key].append(value)

        if examples and "reply" in examples[0].meta:  # unpaired examples (KTO): one row each
            rows = [example_reply(ex) for ex in examples]
            batch = unpaired_to_batch(rows, self.tokenizer, kl_rows=self.kl_rows)
            for row in rows:
                add(row.id, row.id, row.prompt, row.completion)
        else:
            pairs = [example_pair(ex) for ex in examples]
            batch = pairs_to_batch(
                pairs,
                self.tokenizer,
                messages=self._messages if self.task_prompts else None,
                kl_rows=self.kl_rows,
            )
            for pair in pairs:
                for kind, reply in (("chosen", pair.chosen), ("rejected", pair.rejected)):
                    add(f"{pair.id}-{kind}", pair.id, pair.prompt, reply)
        batch[F.REWARDS] = batch[
            F.PREFERENCE_LABEL
        ].float()  # the reward stage's output: the label (0 on a kl row)
        if self.kl_rows:  # row i + n is row i's prompt with row j's response (pairs_to_batch)
            partners = mismatched_partners(meta[F.PROMPT_TEXT])
            texts = meta[F.RESPONSE_TEXT]
            for key in meta:
                meta[key] = meta[key] + [f"{v}-kl" if key == F.UID else v for v in meta[key]]
            meta[F.RESPONSE_TEXT][len(texts) :] = [texts[j] for j in partners]
        meta[F.ROLE] = [Role.SOLVER.value] * len(batch)
        meta[F.SAMPLE_TYPE] = [SampleType.ANSWER.value] * len(batch)
        batch.meta.update(meta)
        return batch
