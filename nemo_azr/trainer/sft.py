"""Supervised warm-up: a few steps of NLL on the task's reference responses before RL.

A randomly initialised tiny model almost never emits a parseable answer, so RL has no signal; a
short warm-up teaches the output format (and some of the task), after which RL improves reward.

The warm-up can stop between two of its steps (a preemption signal) and continue later from a
checkpoint: :meth:`SFTWarmup.state_dict` holds its position and optimizer state, and
:meth:`SFTWarmup.load_state_dict` replays the data of the steps already taken (cheap: prompts are
only built, not trained on) so the loader and the workflow's own random draws continue exactly
where they stopped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.capabilities import SupervisedWarmupPairs
from nemo_azr.contracts.task import Task
from nemo_azr.errors import CheckpointError
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.tasks.dataloader import PromptLoader

SFT_SEED_SALT = 7907


class SFTWarmup:
    """``cfg.sft_warmup.steps`` steps of supervised NLL; :meth:`run` may stop early and be resumed.

    A workflow with ``sft_pairs(examples) -> [(prompt ids, target ids)]`` supplies its own targets
    (e.g. RLCR's two turns); otherwise the target is ``task.reference_response`` after the prompt.
    """

    def __init__(self, policy, task: Task, tokenizer, cfg: NemoAzrConfig, *, workflow: Any = None) -> None:
        wcfg = cfg.sft_warmup
        self.policy, self.task, self.tokenizer, self.workflow = policy, task, tokenizer, workflow
        self.total = wcfg.steps
        self.loader = PromptLoader(
            task.examples, wcfg.batch_size, shuffle=True, seed=cfg.seed + SFT_SEED_SALT
        )
        self.optimizer = policy.sft_optimizer(wcfg.lr)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.step = 0  # warm-up steps taken
        self.losses: list[float] = []  # of the steps taken by this process

    @property
    def done(self) -> bool:
        return self.step >= self.total

    @property
    def resumable(self) -> bool:
        """Whether the optimizer state can be saved and restored: a plain torch optimizer (a
        sharded one holds per-rank state that a warm-up checkpoint does not keep)."""
        return isinstance(self.optimizer, torch.optim.Optimizer)

    def _next_batch(self) -> Batch:
        examples = self.loader.next_batch()
        if isinstance(self.workflow, SupervisedWarmupPairs):
            prompts, targets = (list(x) for x in zip(*self.workflow.sft_pairs(examples)))
        else:
            tok = self.tokenizer
            prompts = [encode_prompt(tok, self.task.messages(ex)) for ex in examples]
            targets = [
                tok(self.task.reference_response(ex), add_special_tokens=False)["input_ids"]
                + [tok.eos_token_id]
                for ex in examples
            ]
        return Batch(pack_prompt_response(prompts, targets, None, pad_id=self.pad))

    def run(
        self,
        on_step: Callable[[int, float], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[float]:
        """Train the remaining steps; before each, ``should_stop()`` may end the warm-up early."""
        while not self.done:
            if should_stop is not None and should_stop():
                break
            loss = self.policy.sft_step(self._next_batch(), self.optimizer)
            self.losses.append(loss)
            self.step += 1
            if on_step is not None:
                on_step(self.step - 1, loss)
        return self.losses

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "total": self.total, "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue after ``state["step"]`` steps: replay their data, restore the optimizer."""
        try:
            step, optimizer_state = int(state["step"]), state["optimizer"]
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"supervised warm-up state is incomplete or malformed ({exc})") from None
        for _ in range(step):
            self._next_batch()
        self.optimizer.load_state_dict(optimizer_state)
        self.step = step


def run_sft_warmup(
    policy,
    task: Task,
    tokenizer,
    cfg: NemoAzrConfig,
    on_step: Callable[[int, float], None] | None = None,
    *,
    workflow: Any = None,
) -> list[float]:
    """The whole warm-up in one go; returns the loss of each step."""
    return SFTWarmup(policy, task, tokenizer, cfg, workflow=workflow).run(on_step)
