"""The ``azr`` rollout workflow: propose -> solve in environments -> filter -> re-propose -> joint batch.

One ``run`` is one training step of seeds 000/001:

1. the proposer writes one question group per seed prompt (one batched generate);
2. every question is solved ``rollout_n`` times in fresh environments (one multi-step rollout for
   all episodes), evaluated, and scored by the rule or LLM evaluators;
3. ``compute_unified_reward_and_filter`` marks learnable questions and samples one per mixed group;
4. groups with no mixed learnability (or an unparseable proposal) are re-proposed, solved and
   filtered again - only those, up to ``max_repropose_attempts`` times;
5. the joint batch keeps each prompt's sampled question with its responses plus the proposer
   trajectory, with solver, proposer and combined rewards.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from nemo_azr.contracts import Batch, Role
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.capabilities import KeysQuestions, PlainTasks
from nemo_azr.contracts.generation import GenerationBackend, SamplingParams
from nemo_azr.contracts.schema import PROMPT_FEEDBACK, STEP_ROLE_ADVANTAGE_SCALES
from nemo_azr.contracts.task import Example, Task
from nemo_azr.envs.base import ProposalDomain
from nemo_azr.registry import WORKFLOWS
from nemo_azr.rewards.evaluators import EpisodeScores, score_episodes
from nemo_azr.rewards.judge import LLMJudge, build_judge
from nemo_azr.rollout.multi_step import (
    Episode,
    evaluate_episode,
    history_messages,
    run_episodes,
    scripted_turn_pairs,
    start_episodes,
)
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.selfplay.joint_batch import INFO_KEY, SolvedGroup, build_joint_batch, build_plain_rows
from nemo_azr.selfplay.learnability import GroupFilterResult, QuestionScores, filter_group
from nemo_azr.selfplay.metrics import (
    band_miss_metrics,
    filter_metrics,
    harm_metrics,
    joint_metrics,
    plain_metrics,
)
from nemo_azr.selfplay.proposer import Proposal, propose, template_proposals
from nemo_azr.selfplay.reference_buffer import ReferenceBuffer, learnable_questions
from nemo_azr.selfplay.repetition import distinct_share, identical_question_keys, repetition_penalties
from nemo_azr.selfplay.solver_gate import SolverGate
from nemo_azr.utils.seeding import step_seed

FILTER_RNG_SALT = 6007  # the learnable-question sampling RNG of a step
TEMPLATE_RNG_SALT = 6011  # templated groups (enable_task_proposal: false)
WARMUP_SEED_SALT = 6029
REFERENCE_RNG_SALT = 6037  # the reference tasks each proposer prompt of a step shows
WARMUP_POOL_SIZE = 16  # distinct templated groups per seed task in the supervised warm-up


@WORKFLOWS.register("azr")
class AbsoluteZeroWorkflow:
    def __init__(self, task: Task, tokenizer, cfg) -> None:
        self.domain: ProposalDomain = task.domain
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.az = cfg.absolute_zero
        self.rollout_n = cfg.generation.n_samples
        # Rows per seed prompt when every group succeeds: rollout_n solvers + 1 proposer.
        proposer_rows = (
            (self.rollout_n if self.az.proposer_rows == "aligned" else 1)
            if self.az.enable_task_proposal
            else 0
        )
        self.rows_per_prompt = self.rollout_n + proposer_rows
        if self.az.solver_plain_tasks:  # the plain tasks' rows, spread over the step's prompts
            per_step = max(1, cfg.data.prompts_per_step)
            plain = min(self.az.solver_plain_tasks, per_step)
            self.rows_per_prompt += math.ceil(plain * self.rollout_n / per_step)
        # Solver rows are grouped per question by the run's estimator; proposer rows (one group per
        # batch) by ``proposer_estimator``.
        self.role_estimators = {"solver": cfg.algorithm.estimator, "proposer": self.az.proposer_estimator}
        self.role_advantage_scales = {
            "solver": self.az.solver_advantage_scale,
            "proposer": self.az.proposer_advantage_scale,
        }
        self.solver_gate = SolverGate(
            self.az.solver_gate_learnable_ratio,
            self.az.solver_gate_decay,
            self.az.solver_gate_max_consecutive,
        )
        self.references = ReferenceBuffer(self.az.proposer_reference_buffer)
        self._reference_rng = random.Random(cfg.seed + REFERENCE_RNG_SALT)  # run() reseeds it per step
        self._references_shown: list[int] = []
        self._judge: LLMJudge | None = None
        self._judge_metrics: dict[str, float] = {}
        self._warmup_rng = random.Random(cfg.seed + WARMUP_SEED_SALT)
        self._warmup_pool: dict[str, list[tuple[str, list[dict], list[list[int]]]]] = {}
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    # --- the step ----------------------------------------------------------------------------------
    def filter(self, group: SolvedGroup, rng: random.Random) -> GroupFilterResult:
        """The band filter of one solved group; ``group_repeats: merge`` judges a question written twice
        in the group once, on its copies' responses pooled."""
        keys = identical_question_keys(group.proposal.questions) if self.az.group_repeats == "merge" else None
        return filter_group(_scores(group), self.az, rng, repeat_keys=keys)

    def run(
        self, examples: Sequence[Example], backend: GenerationBackend, sampling: SamplingParams, *, step: int
    ) -> Batch:
        az, seed = self.az, self.cfg.seed
        filter_rng = random.Random(step_seed(seed, step, salt=FILTER_RNG_SALT))
        template_rng = random.Random(step_seed(seed, step, salt=TEMPLATE_RNG_SALT))
        self._reference_rng = random.Random(step_seed(seed, step, salt=REFERENCE_RNG_SALT))
        self._references_shown = []
        self._judge_metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        domain_clock = self.domain.timing()

        groups = self.propose_and_solve(list(examples), backend, sampling, template_rng, attempt=0)
        for g in groups:
            g.result = self.filter(g, filter_rng)
        metrics = {
            "unified_filter/initial_learnable_ratio": filter_metrics(groups)["unified_filter/learnable_ratio"]
        }
        metrics["unified_filter/initial_num_repropose"] = float(sum(g.result.flagged for g in groups))
        metrics.update(band_miss_metrics(groups, az))
        train_solver = self.solver_gate.observe(metrics["unified_filter/initial_learnable_ratio"])
        num_trajectories = sum(g.proposal.trajectory is not None for g in groups)
        unparseable = sum(bool(g.proposal.error) for g in groups)

        by_prompt = {g.prompt_id: g for g in groups}
        evaluated = list(groups)  # every group of the step, for the reference buffer
        superseded: list[SolvedGroup] = []  # attempts a re-proposal replaced, in order
        attempts = reproposed = 0
        while attempts < az.max_repropose_attempts:
            flagged = [g for g in by_prompt.values() if g.result.flagged]
            if not flagged:
                break
            attempts += 1
            reproposed += len(flagged)
            seeds = [g.proposal.seed_task for g in flagged]
            for g in self.propose_and_solve(seeds, backend, sampling, template_rng, attempt=attempts):
                g.result = self.filter(g, filter_rng)
                superseded.append(by_prompt[g.prompt_id])
                by_prompt[g.prompt_id] = g  # replaces the flagged group's data
                evaluated.append(g)
                num_trajectories += g.proposal.trajectory is not None
                unparseable += bool(g.proposal.error)

        final = list(by_prompt.values())
        # proposer_attempts=all: the replaced attempts train the proposer too (decision 189)
        extra = superseded if az.proposer_attempts == "all" else []
        metrics.update(self._score_repetition(final + extra))
        batch = build_joint_batch(
            final,
            az,
            step=step,
            pad_id=self.pad_id,
            include_proposer=az.enable_task_proposal,
            rollout_n=self.rollout_n,
            superseded=extra,
        )
        if az.proposer_temperature and len(batch):  # the proposer rows were sampled at their own temperature
            batch.tensors[F.SAMPLING_TEMPERATURE] = torch.tensor(
                [
                    az.proposer_temperature if role == Role.PROPOSER.value else sampling.temperature
                    for role in batch[F.ROLE]
                ],
                dtype=torch.float32,
            )
        metrics.update(filter_metrics(final))
        metrics.update(harm_metrics(final))
        metrics.update(joint_metrics(batch, num_trajectories=num_trajectories))
        # a held-back step with solver_gate_closed=drop would drop them: not solved at all then
        if az.solver_plain_tasks and (train_solver or az.solver_gate_closed == "kl_only"):
            seeds = [g.proposal.seed_task for g in groups[: az.solver_plain_tasks]]
            plain, plain_metrics = self.solve_plain(seeds, backend, sampling, step=step)
            metrics.update(plain_metrics)
            if F.SAMPLING_TEMPERATURE in batch and len(plain):  # sampled at the solver's temperature
                plain.tensors[F.SAMPLING_TEMPERATURE] = torch.full((len(plain),), float(sampling.temperature))
            info = batch.info
            batch = Batch.concat([batch, plain])
            batch.info = info
        if not train_solver:  # the gate holds the solver back this step
            # kl_only: its rows stay with zero advantages, so only their KL term trains them
            if az.solver_gate_closed == "kl_only":
                batch.info[STEP_ROLE_ADVANTAGE_SCALES] = {Role.SOLVER.value: 0.0}
            else:  # the proposer's rows alone
                batch = batch.index([i for i, role in enumerate(batch[F.ROLE]) if role != Role.SOLVER.value])
        if self.solver_gate.enabled:
            metrics["solver_gate/learnable_ratio_avg"] = float(self.solver_gate.average or 0.0)
            metrics["solver_gate/solver_trained"] = float(train_solver)
        metrics.update(self._judge_metrics)
        if az.proposer_references:  # the next step's prompts show this step's in-band questions too
            for g in evaluated:
                self.references.add(learnable_questions(g.proposal.questions, g.result.learnable))
            shown = self._references_shown
            metrics["proposer/references_shown"] = sum(shown) / len(shown) if shown else 0.0
            metrics["proposer/reference_buffer_size"] = float(len(self.references))
        metrics.update(
            {
                "repropose/total_attempts": float(attempts),
                "repropose/groups_reproposed": float(reproposed),
                "repropose/final_non_learnable": float(sum(g.result.flagged for g in final)),
                "proposer/num_unparseable": float(unparseable),
                # share of proposer generations (first proposals and re-proposals) that parsed into a
                # valid question group: every program ran in the sandbox
                "proposer/valid_task_rate": 1.0 - unparseable / num_trajectories if num_trajectories else 0.0,
                "timing/azr_rollout_s": time.perf_counter() - t0,
            }
        )
        for key, seconds in self.domain.timing().items():  # this step's share (e.g. timing/sandbox_s)
            metrics[key] = seconds - domain_clock.get(key, 0.0)
        batch.info["metrics"] = metrics
        batch.info.setdefault(INFO_KEY, {})["learnable"] = {g.prompt_id: g.result.learnable for g in final}
        # the curriculum's signal: the share of a seed's group in the band, its final group's or its
        # first proposal's (absolute_zero.curriculum_feedback)
        fed = groups if az.curriculum_feedback == "first_pass" else final
        batch.info[PROMPT_FEEDBACK] = {g.prompt_id: _band_share(g) for g in fed}
        return batch

    def _score_repetition(self, groups: list[SolvedGroup]) -> dict[str, float]:
        """Sets each group's repetition penalty (selfplay.repetition) where the domain keys its
        questions, and returns the batch's distinct-question share and mean penalty."""
        if not isinstance(self.domain, KeysQuestions):
            return {}
        keys = [[self.domain.question_key(q) for q in g.proposal.questions] for g in groups]
        for g, penalty in zip(groups, repetition_penalties(keys)):
            g.repetition_penalty = penalty
        parsed = [g.repetition_penalty for g, k in zip(groups, keys) if k]
        return {
            "proposer/distinct_question_share": distinct_share(keys),
            "proposer/repetition_penalty_mean": sum(parsed) / len(parsed) if parsed else 0.0,
        }

    # --- state carried across steps (trainer_state.json: a resume goes on with the same gate) ----------
    def state_dict(self) -> dict:
        return {"solver_gate": self.solver_gate.state_dict(), "references": self.references.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.solver_gate.load_state_dict(state.get("solver_gate", {}))
        self.references.load_state_dict(state.get("references", {}))

    # --- propose + solve + score -------------------------------------------------------------------
    def propose_and_solve(
        self,
        seeds: list[Example],
        backend: GenerationBackend,
        sampling: SamplingParams,
        template_rng: random.Random,
        *,
        attempt: int,
        solver_backend: GenerationBackend | None = None,
    ) -> list[SolvedGroup]:
        """Propose a group per seed with ``backend`` and solve every parsed question with
        ``solver_backend`` (default: the same model; the held-out evaluation can fix another one,
        so proposers of different checkpoints meet one solver)."""
        az, k = self.az, self.az.questions_per_group
        if az.enable_task_proposal:
            p_sampling = replace(
                sampling,
                max_new_tokens=az.proposer_max_new_tokens or sampling.max_new_tokens,
                temperature=az.proposer_temperature or sampling.temperature,
            )
            references = None
            if az.proposer_references:
                references = [
                    self.references.sample(az.proposer_references, self._reference_rng) for _ in seeds
                ]
                self._references_shown.extend(len(r) for r in references)
            proposals = propose(
                seeds,
                self.domain,
                backend,
                p_sampling,
                self.tokenizer,
                num_questions=k,
                attempt=attempt,
                references=references,
            )
        else:
            proposals = template_proposals(seeds, self.domain, template_rng, num_questions=k, attempt=attempt)
        return self._solve(proposals, solver_backend or backend, sampling)

    def _solve(
        self, proposals: list[Proposal], backend: GenerationBackend, sampling: SamplingParams
    ) -> list[SolvedGroup]:
        """All questions of all proposals, ``rollout_n`` episodes each, in one multi-step rollout."""
        n = self.rollout_n
        configs = [q for p in proposals for q in p.questions for _ in range(n)]
        episodes, scores = self.solve_tasks(configs, backend, sampling)
        groups, i = [], 0
        for p in proposals:
            g = SolvedGroup(p)
            for _ in p.questions:
                g.episodes.append(episodes[i : i + n])
                g.safety.append(list(scores.safety[i : i + n]))
                g.completion.append(list(scores.completion[i : i + n]))
                g.format.append(list(scores.format[i : i + n]))
                i += n
            groups.append(g)
        return groups

    def solve_plain(
        self, seeds: list[Example], backend: GenerationBackend, sampling: SamplingParams, *, step: int
    ) -> tuple[Batch, dict[str, float]]:
        """Each seed's goal alone (the domain's ``plain_task``), ``rollout_n`` episodes each, as solver
        rows outside the band (``absolute_zero.solver_plain_tasks``), and their ``plain/*`` metrics."""
        if not isinstance(self.domain, PlainTasks):  # config_check refuses such a run first
            raise TypeError(f"absolute_zero.env={self.az.env} cannot pose plain tasks")
        n = self.rollout_n
        configs = [self.domain.plain_task(seed) for seed in seeds for _ in range(n)]
        episodes, scores = self.solve_tasks(configs, backend, sampling)
        batch = build_plain_rows(
            seeds, episodes, scores.safety, scores.completion, scores.format, self.az,
            step=step, pad_id=self.pad_id,
        )  # fmt: skip
        return batch, plain_metrics(batch)

    def solve_tasks(
        self,
        configs: list[dict],
        backend: GenerationBackend,
        sampling: SamplingParams,
        *,
        on_turn: Callable[[int, int, int], None] | None = None,
    ) -> tuple[list[Episode], EpisodeScores]:
        """One episode per task config (all advance together), evaluated and scored; ``on_turn`` as
        :func:`run_episodes` takes it."""
        episodes = start_episodes(
            configs,
            self.domain.make_env,
            self.tokenizer,
            system_prompt=self.domain.solver_system_prompt(),
            demonstrations=self.domain.solver_demonstrations(),
        )
        s_sampling = replace(
            sampling, max_new_tokens=self.az.solver_max_new_tokens or sampling.max_new_tokens
        )
        run_episodes(
            episodes,
            backend,
            s_sampling,
            self.tokenizer,
            max_steps=self.az.max_env_steps,
            step_timeout_s=self.az.env_step_timeout_s,
            max_total_tokens=getattr(self.tokenizer, "model_max_length", 0) or 0,
            on_turn=on_turn,
        )
        scores = score_episodes(
            [evaluate_episode(ep) for ep in episodes],
            [history_messages(ep) for ep in episodes],
            self.az,
            self._get_judge(backend),
        )
        # Counts add up over the step's solve calls; the rate is recomputed from the totals.
        for key, value in scores.metrics.items():
            self._judge_metrics[key] = self._judge_metrics.get(key, 0.0) + value
        calls = self._judge_metrics.get("judge/calls", 0.0)
        self._judge_metrics["judge/parse_failure_rate"] = (
            self._judge_metrics.get("judge/parse_failures", 0.0) / calls if calls else 0.0
        )
        return episodes, scores

    def _get_judge(self, backend: GenerationBackend) -> LLMJudge | None:
        if "llm" not in (self.az.safety_evaluator_type, self.az.completion_evaluator_type):
            return None
        if self._judge is None or not self.az.judge.model_path:
            # The policy judges through the current backend (its weights change every step).
            self._judge = build_judge(
                self.az.judge,
                policy_backend=backend,
                tokenizer=self.tokenizer,
                device=self.cfg.trainer.device,
            )
        return self._judge

    # --- supervised warm-up ------------------------------------------------------------------------
    def _warmup_group(self, seed_task: Example) -> tuple[str, list[dict], list[list[int]]]:
        """A templated group for ``seed_task`` with its solver prompt ids, drawn from a pool of
        ``WARMUP_POOL_SIZE`` per seed: parsing can be costly (python_exec runs every program in
        the sandbox), so each distinct group is parsed once and reused."""
        pool = self._warmup_pool.setdefault(seed_task.prompt_id, [])
        if len(pool) < WARMUP_POOL_SIZE:
            k = self.az.questions_per_group
            text = self.domain.warmup_proposal(seed_task, k, self._warmup_rng)
            questions = self.domain.warmup_solver_questions(
                self.domain.parse_proposal(text, seed_task, k), seed_task
            )
            episodes = start_episodes(
                questions,
                self.domain.make_env,
                self.tokenizer,
                system_prompt=self.domain.solver_system_prompt(),
                demonstrations=self.domain.solver_demonstrations(),
            )
            pool.append((text, questions, [ep.prompt_ids for ep in episodes]))
            return pool[-1]
        return self._warmup_rng.choice(pool)

    def sft_pairs(self, examples: Sequence[Example]) -> list[tuple[list[int], list[int]]]:
        """Templated proposer outputs and solver turns for each seed (see the domain's templates)."""
        tok, rng, k = self.tokenizer, self._warmup_rng, self.az.questions_per_group
        eos = [tok.eos_token_id]
        pairs = []
        for seed_task in examples:
            text, questions, solver_prompts = self._warmup_group(seed_task)
            if self.az.enable_task_proposal:
                prompt = encode_prompt(tok, self.domain.proposer_messages(seed_task, k))
                pairs.append((prompt, tok(text, add_special_tokens=False)["input_ids"] + eos))
            for q, prompt_ids in zip(questions, solver_prompts):
                turns = self.domain.warmup_turns(q, rng)
                pairs.extend(scripted_turn_pairs(self.domain.make_env, q, prompt_ids, turns, tok))
        return pairs


def _scores(g: SolvedGroup) -> list[QuestionScores]:
    return [QuestionScores(s, c) for s, c in zip(g.safety, g.completion)]


def _band_share(group: SolvedGroup) -> float:
    """The share of a solved group's questions that reached the learnability band (0 when none parsed)."""
    learnable = group.result.learnable
    return sum(learnable) / len(learnable) if learnable else 0.0
