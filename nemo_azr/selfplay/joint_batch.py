"""The joint proposer + solver batch (seed 001 steps 10-13).

Per prompt: the sampled question's ``rollout_n`` solver rows, and the prompt's proposer trajectory
(``role = proposer``) laid out by ``absolute_zero.proposer_rows``:

* ``per_prompt`` (default, decision 34): one row per prompt, trained once;
* ``aligned`` (seed 001's "数据对齐"): the proposer row repeated ``rollout_n`` times, copy ``r``
  aligned with solver row ``r`` of the sampled question (meta ``aligned_uid``), so the proposer's
  log-probs and reward travel beside each solver response. A prompt still flagged after the last
  round has no solver rows; its ``rollout_n`` copies carry the -0.5 reward with an empty
  ``aligned_uid`` (the seed's text would drop them, leaving every proposer row at 1.0).

Rewards::

    solver rows:   rewards = harm_rewards + format_reward_weight * format_rewards
                   combined_rewards = rewards + proposer_reward_weight * proposer_rewards
                   (the row's training reward is combined_rewards)
    proposer rows: proposer_rewards (1.0 learnable / 0.0 not learnable / -0.5 still flagged)
                   + proposer_format_reward_weight * (1 if the proposal parsed else 0)  [default 0]
                   + proposer_band_reward_weight * the group's best band_closeness       [default 0]
                   - proposer_repetition_penalty * the group's repetition penalty          [default 0]

With ``absolute_zero.proposer_attempts: all`` every attempt a re-proposal replaced adds its proposer
rows too (uid ``...-proposer-a<attempt>``), rewarded by its own status (flagged: -0.5) and terms.

Solver rows are grouped per question (``group_id``); all proposer rows of the batch form one group,
so a group-mean estimator normalises proposer rewards across the batch's proposers. ``prompt_id``
links a proposer row to its solver rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_azr.contracts import Batch, Role, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.rollout.multi_step import Episode
from nemo_azr.selfplay.learnability import GroupFilterResult, harm_reward, proposer_reward
from nemo_azr.selfplay.proposer import Proposal

#: Per-row meta the joint batch carries besides the contract's ids (for logging and tests).
#: Per-row meta: the task type a row belongs to (python_exec: deduction | abduction | induction; ""
#: where the environment has none): the question's for solver rows, the one the proposer was asked to
#: write for proposer rows. TRR++ normalises per task type x role.
TASK_TYPE = "task_type"
ALIGNED_UID = (
    "aligned_uid"  # proposer rows (aligned layout): the uid of the solver row a copy is aligned with
)
PROPOSER_ROW_LAYOUTS = ("per_prompt", "aligned")
SELFPLAY_META = (
    TASK_TYPE,
    "safety_score",
    "completion_score",
    "format_reward",
    "harm_reward",
    "solver_reward",
    "proposer_reward",
    "end_reason",
    "finish_reason",
    "num_turns",
    ALIGNED_UID,
)
INFO_KEY = "absolute_zero"  # batch.info[INFO_KEY]: the seeds' proposer_* fields, sampled indices


@dataclass
class SolvedGroup:
    """A proposal with its rollouts, scores and filter result ([question][response] lists)."""

    proposal: Proposal
    episodes: list[list[Episode]] = field(default_factory=list)
    safety: list[list[float]] = field(default_factory=list)
    completion: list[list[float]] = field(default_factory=list)
    format: list[list[float]] = field(default_factory=list)
    result: GroupFilterResult | None = None
    repetition_penalty: float = 0.0  # selfplay.repetition: its questions' share of the batch's repeats

    @property
    def prompt_id(self) -> str:
        return self.proposal.prompt_id

    def question_id(self, index: int) -> str:
        return f"{self.prompt_id}-a{self.proposal.attempt}-q{index}"


def _seed_type(group: SolvedGroup) -> str:
    return str(group.proposal.seed_task.meta.get("type") or "")


def _empty_meta() -> dict[str, list[Any]]:
    keys = (
        F.UID,
        F.GROUP_ID,
        F.PROMPT_ID,
        F.QUESTION_ID,
        F.ROLE,
        F.SAMPLE_TYPE,
        F.POLICY_VERSION,
        F.PROMPT_TEXT,
        F.RESPONSE_TEXT,
        *SELFPLAY_META,
    )
    return {k: [] for k in keys}


class _Rows:
    """Rows collected in order, packed into one ``Batch`` at the end."""

    def __init__(self) -> None:
        self.prompts, self.responses, self.logps, self.masks, self.rewards = [], [], [], [], []
        self.meta = _empty_meta()

    def add(self, row: dict[str, Any], prompt, response, logp, mask, reward: float) -> None:
        self.prompts.append(prompt)
        self.responses.append(response)
        self.logps.append(logp)
        self.masks.append(mask)
        self.rewards.append(reward)
        for key in self.meta:
            self.meta[key].append(row.get(key))

    def add_solver_episode(self, ep: Episode, reward: float, **row: Any) -> None:
        """A solver row: the episode's tokens, the ids and scores in ``row``, the episode's own meta."""
        row.update(
            {
                F.ROLE: Role.SOLVER.value,
                F.SAMPLE_TYPE: SampleType.ANSWER.value,
                F.POLICY_VERSION: ep.policy_version,
                F.RESPONSE_TEXT: " || ".join(ep.turns),
                "end_reason": ep.end_reason,
                "finish_reason": ep.finish_reason,
                "num_turns": ep.num_turns,
            }
        )
        self.add(row, ep.prompt_ids, ep.response_ids, ep.response_logprobs, ep.response_mask, reward)

    def batch(self, pad_id: int, info: dict[str, Any]) -> Batch:
        if not self.prompts:
            return Batch(info=info)
        tensors = pack_prompt_response(
            self.prompts, self.responses, self.logps, pad_id=pad_id, response_masks=self.masks
        )
        tensors[F.REWARDS] = torch.tensor(self.rewards, dtype=torch.float32)
        return Batch(tensors, self.meta, info)


def build_joint_batch(
    groups: list[SolvedGroup],
    cfg: Any,
    *,
    step: int,
    pad_id: int,
    include_proposer: bool = True,
    rollout_n: int = 1,
    superseded: Sequence[SolvedGroup] = (),
) -> Batch:
    """Solver rows of every group with a sampled question, then the proposer rows of every group
    that has a proposer trajectory (one each, or ``rollout_n`` each with
    ``cfg.proposer_rows == "aligned"``). ``cfg`` is the ``absolute_zero`` node.

    ``superseded``: earlier attempts that a re-proposal replaced (``proposer_attempts: all``); each
    adds proposer rows only, rewarded as the flagged group it was, after the final groups' rows."""
    layout = getattr(cfg, "proposer_rows", "per_prompt")
    if layout not in PROPOSER_ROW_LAYOUTS:
        raise ValueError(
            f"absolute_zero.proposer_rows={layout!r}; use one of {', '.join(PROPOSER_ROW_LAYOUTS)}"
        )
    rows = _Rows()
    trajectories, sampled, p_rewards = {}, {}, {}
    for g in groups:
        status = g.result.status
        p_reward = proposer_reward(status)
        p_rewards[g.prompt_id] = p_reward
        sampled[g.prompt_id] = g.result.sampled_index
        if g.result.flagged:
            continue
        qi = g.result.sampled_index
        question = g.proposal.questions[qi]
        for r, ep in enumerate(g.episodes[qi]):
            harm = g.result.harm_rewards[qi][r]
            fmt = g.format[qi][r]
            solver_reward = harm + cfg.format_reward_weight * fmt
            # Without a proposer (templated groups) there is no proposer reward to add.
            combined = solver_reward + (cfg.proposer_reward_weight * p_reward if include_proposer else 0.0)
            rows.add_solver_episode(
                ep,
                combined,
                **{
                    F.UID: f"s{step}-{g.question_id(qi)}-r{r}",
                    F.GROUP_ID: f"s{step}-{g.question_id(qi)}",
                    F.PROMPT_ID: g.prompt_id,
                    F.QUESTION_ID: g.question_id(qi),
                    F.PROMPT_TEXT: str(question.get("instruction", "")),
                    TASK_TYPE: str(question.get("type") or _seed_type(g)),
                    "safety_score": g.safety[qi][r],
                    "completion_score": g.completion[qi][r],
                    "format_reward": fmt,
                    "harm_reward": harm,
                    "solver_reward": solver_reward,
                    "proposer_reward": p_reward,
                },
            )

    for g, final in [*((g, True) for g in groups), *((g, False) for g in superseded)]:
        traj = g.proposal.trajectory
        if traj is None or not include_proposer:
            continue
        if final:  # the seeds' fields describe each prompt's final proposal
            trajectories[g.prompt_id] = traj.seed_fields()
        qi = g.result.sampled_index
        if layout == "aligned":
            solver_uids = (
                [f"s{step}-{g.question_id(qi)}-r{r}" for r in range(len(g.episodes[qi]))] if qi >= 0 else []
            )
            copies = [(f"-r{r}", solver_uids[r] if r < len(solver_uids) else "") for r in range(rollout_n)]
        else:
            copies = [("", "")]
        # the proposal format term (absolute_zero.proposer_format_reward_weight): a parsed group
        # beats an unparseable one even when both end flagged (-0.5), so the format keeps a gradient
        fmt_weight = getattr(cfg, "proposer_format_reward_weight", 0.0)
        # the band term (absolute_zero.proposer_band_reward_weight): a group that misses the band by
        # less earns more, so a proposer facing a solver safer than the band learns to tempt harder
        band_weight = getattr(cfg, "proposer_band_reward_weight", 0.0)
        # the repetition term (absolute_zero.proposer_repetition_penalty): a group asking what the
        # rest of the batch asks earns less, so the proposer keeps more than a few temptations
        repeat_weight = getattr(cfg, "proposer_repetition_penalty", 0.0)
        reward = (
            proposer_reward(g.result.status)
            + fmt_weight * (0.0 if g.proposal.error else 1.0)
            + band_weight * g.result.best_closeness
            - repeat_weight * g.repetition_penalty
        )
        attempt = "" if final else f"-a{g.proposal.attempt}"  # a superseded attempt's rows
        for suffix, aligned in copies:
            _add_proposer_row(rows.add, g, traj, step, reward, attempt + suffix, aligned)

    info = {
        INFO_KEY: {
            "proposer_trajectories": trajectories,
            "sampled_indices": sampled,
            "proposer_rewards": p_rewards,
        }
    }
    return rows.batch(pad_id, info)


PLAIN_TASK_TYPE = "plain"  # TASK_TYPE of a plain task's rows (absolute_zero.solver_plain_tasks)


def build_plain_rows(
    seeds: Sequence[Any],
    episodes: Sequence[Episode],
    safety: Sequence[float],
    completion: Sequence[float],
    fmt: Sequence[float],
    cfg: Any,
    *,
    step: int,
    pad_id: int,
) -> Batch:
    """Solver rows of the step's plain tasks (``absolute_zero.solver_plain_tasks``): seed ``k``'s
    goal alone solved ``len(episodes) // len(seeds)`` times, episodes in seed order. Each seed's
    episodes form one group (``...-plain``), rewarded like any solver row without the proposer term:
    ``harm_reward + format_reward_weight * format`` (there is no proposal to credit)."""
    n = len(episodes) // len(seeds) if seeds else 0
    rows = _Rows()
    for k, seed in enumerate(seeds):
        question_id = f"{seed.prompt_id}-plain"
        for r in range(n):
            i = k * n + r
            harm = harm_reward(safety[i], completion[i], cfg)
            reward = harm + cfg.format_reward_weight * fmt[i]
            rows.add_solver_episode(
                episodes[i],
                reward,
                **{
                    F.UID: f"s{step}-{question_id}-r{r}",
                    F.GROUP_ID: f"s{step}-{question_id}",
                    F.PROMPT_ID: seed.prompt_id,
                    F.QUESTION_ID: question_id,
                    F.PROMPT_TEXT: str(seed.question),
                    TASK_TYPE: PLAIN_TASK_TYPE,
                    "safety_score": safety[i],
                    "completion_score": completion[i],
                    "format_reward": fmt[i],
                    "harm_reward": harm,
                    "solver_reward": reward,
                },
            )
    return rows.batch(pad_id, {})


def _add_proposer_row(add, g: SolvedGroup, traj, step: int, reward: float, suffix: str, aligned: str) -> None:
    qi = g.result.sampled_index
    row = {
        F.UID: f"s{step}-{g.prompt_id}-proposer{suffix}",
        F.GROUP_ID: f"s{step}-proposers",
        F.PROMPT_ID: g.prompt_id,
        F.QUESTION_ID: g.question_id(qi) if qi >= 0 else "",
        F.ROLE: Role.PROPOSER.value,
        F.SAMPLE_TYPE: SampleType.PROPOSAL.value,
        F.POLICY_VERSION: traj.policy_version,
        F.PROMPT_TEXT: g.proposal.seed_task.question,
        F.RESPONSE_TEXT: traj.text,
        TASK_TYPE: _seed_type(g),
        "proposer_reward": reward,
        "end_reason": "proposal_error" if g.proposal.error else "",
        "finish_reason": traj.finish_reason,
        "num_turns": 1,
        ALIGNED_UID: aligned,
    }
    add(row, traj.prompt_ids, traj.response_ids, traj.log_probs, [1] * len(traj.response_ids), reward)
