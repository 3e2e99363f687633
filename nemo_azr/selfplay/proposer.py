"""The proposer (seed 001 steps 1, 11, 12): one generation per seed prompt -> one question group.

The trajectory of each generation (prompt ids, generated ids, their log-probs) is kept per
``prompt_id`` so the proposer can be trained on it. An output the domain cannot parse is a failed
group (no questions), re-proposed like a group with no mixed learnability.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nemo_azr.contracts.capabilities import ShowsReferenceTasks
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, SamplingParams
from nemo_azr.contracts.task import Example
from nemo_azr.envs.base import ProposalDomain, ProposalError
from nemo_azr.rollout.single_turn import encode_prompt


@dataclass
class ProposerTrajectory:
    prompt_ids: list[int]
    response_ids: list[int]
    log_probs: list[float]
    text: str
    finish_reason: str
    policy_version: int = 0

    def seed_fields(self) -> dict[str, list]:
        """The seeds' ``proposer_*`` trajectory fields (``input_ids`` = prompt + response)."""
        ids = self.prompt_ids + self.response_ids
        return {
            "input_ids": ids,
            "attention_mask": [1] * len(ids),
            "responses": list(self.response_ids),
            "log_probs": list(self.log_probs),
        }


@dataclass
class Proposal:
    """One proposer attempt for one seed prompt."""

    seed_task: Example
    attempt: int
    questions: list[dict[str, Any]] = field(default_factory=list)  # task configs; [] when it failed
    trajectory: ProposerTrajectory | None = None  # None when questions come from templates
    error: str = ""  # why the output was rejected

    @property
    def prompt_id(self) -> str:
        return self.seed_task.prompt_id


def propose(
    seeds: Sequence[Example],
    domain: ProposalDomain,
    backend: GenerationBackend,
    sampling: SamplingParams,
    tokenizer,
    *,
    num_questions: int,
    attempt: int,
    references: Sequence[Sequence[dict[str, Any]]] | None = None,
) -> list[Proposal]:
    """One batched generate over ``seeds``; each output parsed into a question group.
    ``references``: per seed, the reference tasks its prompt shows (a :class:`ShowsReferenceTasks`
    domain; ``absolute_zero.proposer_references``)."""
    refs = list(references) if references is not None else [[] for _ in seeds]
    if any(refs) and not isinstance(domain, ShowsReferenceTasks):
        raise TypeError(f"the {domain.name} domain cannot show reference tasks to its proposer")
    prompts = [
        encode_prompt(
            tokenizer,
            domain.proposer_messages_with_references(s, num_questions, r)  # type: ignore[attr-defined]
            if r
            else domain.proposer_messages(s, num_questions),
        )
        for s, r in zip(seeds, refs, strict=True)
    ]
    requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompts)]
    outputs = backend.generate(requests, replace(sampling, n=1))
    samples = [out.samples[0] for out in outputs]
    parsed = domain.parse_proposals([s.text for s in samples], list(seeds), num_questions)
    proposals = []
    for seed_task, prompt_ids, out, sample, group in zip(seeds, prompts, outputs, samples, parsed):
        traj = ProposerTrajectory(
            prompt_ids=prompt_ids,
            response_ids=list(sample.token_ids),
            log_probs=list(sample.logprobs),
            text=sample.text,
            finish_reason=sample.finish_reason,
            policy_version=out.policy_version,
        )
        proposal = Proposal(seed_task, attempt, trajectory=traj)
        if isinstance(group, ProposalError):
            proposal.error = str(group)
        else:
            proposal.questions = group
        proposals.append(proposal)
    return proposals


def template_proposals(
    seeds: Sequence[Example], domain: ProposalDomain, rng: random.Random, *, num_questions: int, attempt: int
) -> list[Proposal]:
    """``enable_task_proposal: false``: groups from the domain's templates, with no proposer rows."""
    out = []
    for seed_task in seeds:
        text = domain.warmup_proposal(seed_task, num_questions, rng)
        out.append(Proposal(seed_task, attempt, list(domain.parse_proposal(text, seed_task, num_questions))))
    return out
