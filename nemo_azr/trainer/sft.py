"""Supervised warm-up: a few steps of NLL on the task's reference responses before RL.

A randomly initialised tiny model almost never emits a parseable answer, so RL has no signal; a
short warm-up teaches the output format (and some of the task), after which RL improves reward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.rollout.assemble import pack_prompt_response
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.tasks.base import Task
from nemo_azr.tasks.dataloader import PromptLoader

SFT_SEED_SALT = 7907


def run_sft_warmup(
    policy,
    task: Task,
    tokenizer,
    cfg: NemoAzrConfig,
    on_step: Callable[[int, float], None] | None = None,
    *,
    workflow: Any = None,
) -> list[float]:
    """Returns the loss of each warm-up step.

    A workflow with ``sft_pairs(examples) -> [(prompt ids, target ids)]`` supplies its own targets
    (e.g. RLCR's two turns); otherwise the target is ``task.reference_response`` after the prompt.
    """
    wcfg = cfg.sft_warmup
    loader = PromptLoader(task.examples, wcfg.batch_size, shuffle=True, seed=cfg.seed + SFT_SEED_SALT)
    optimizer = policy.sft_optimizer(wcfg.lr)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = []
    for i in range(wcfg.steps):
        examples = loader.next_batch()
        if hasattr(workflow, "sft_pairs"):
            prompts, targets = (list(x) for x in zip(*workflow.sft_pairs(examples)))
        else:
            prompts = [encode_prompt(tokenizer, task.messages(ex)) for ex in examples]
            targets = [
                tokenizer(task.reference_response(ex), add_special_tokens=False)["input_ids"]
                + [tokenizer.eos_token_id]
                for ex in examples
            ]
        batch = Batch(pack_prompt_response(prompts, targets, None, pad_id=pad))
        losses.append(policy.sft_step(batch, optimizer))
        if on_step is not None:
            on_step(i, losses[-1])
    return losses
