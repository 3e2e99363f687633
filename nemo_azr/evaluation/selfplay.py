"""``nemo-azr eval`` of a self-play (``azr``) run: a held-out evaluation that does not depend on the
proposer, plus the proposer's quality on held-out seeds.

1. **Solver**: every held-out task of the domain (:class:`~nemo_azr.contracts.capabilities.HeldOutSelfPlaySet`;
   ``sandbox_os``: 120 tasks, temptations and plain goals) is run as one greedy episode
   (``eval.greedy``; sampled: ``eval.answers_per_prompt`` episodes per task at the training
   temperature), with the training prompts and turn limits. Scores are the environment's rules
   whatever evaluator the run trains with, so runs with a rule and an LLM judge are compared on one
   scale: safety, completion, the harm reward ``safety_reward_weight * safety +
   task_completion_weight * completion``, and the format score; per task kind too.
2. **Proposer**: ``eval.selfplay_proposals_per_seed`` sampled proposals per held-out seed (training
   temperature), each parsed question solved ``generation.n_samples`` times (sampled) and put
   through the learnability filter, as in a training step's first pass: the parse rate, the
   first-pass learnable ratio (learnable questions / questions of parsed groups), the share of
   groups the filter would keep (mixed), and the proposer reward those groups would earn.
   The questions are solved by the evaluated checkpoint, or by ``eval.selfplay_fixed_solver``: a
   training run's first-pass ratio is measured against a solver that moves with the proposer, and
   a fixed solver separates what the proposer learned from what the solver did.

``eval.selfplay_solver=false`` skips part 1.

``eval.num_examples`` (when set) evaluates a seeded subset of the tasks and of the seeds.
Written to ``eval.output_dir``: ``metrics.json`` and ``samples.jsonl`` (every episode and proposal).
"""

from __future__ import annotations

import copy
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.capabilities import HeldOutSelfPlaySet
from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.selfplay.learnability import harm_reward, proposer_reward

EVAL_SEED_SALT = 104743
REFUSED, RULE_HARMS = "refused", "rule_harms"


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def selfplay_eval_config(cfg: NemoAzrConfig) -> NemoAzrConfig:
    """The run's config with rule evaluators (the held-out scale is the environment's rules)."""
    out = copy.deepcopy(cfg)
    out.absolute_zero.safety_evaluator_type = "rule"
    out.absolute_zero.completion_evaluator_type = "rule"
    return out


def solver_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means over held-out episode records (``safety``, ``completion``, ``harm_reward``, ``format``,
    ``refused``, ``rule_harm``), overall, per ``kind`` and, where the records carry instructions,
    per goal verb (the instruction's first word: ``Mail``, ``Reply``, ``Copy``...), which shows the
    goal families a solver never completes and so never meets inside the learnability band."""

    def block(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {
            "num_tasks": len(rows),
            "safety": _mean([r["safety"] for r in rows]),
            "completion": _mean([r["completion"] for r in rows]),
            "harm_reward": _mean([r["harm_reward"] for r in rows]),
            "format": _mean([r["format"] for r in rows]),
            "refusal_rate": _mean([float(r["refused"]) for r in rows]),
            "rule_harm_rate": _mean([float(r["rule_harm"]) for r in rows]),
        }

    def by(key: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in records:
            groups.setdefault(key(r), []).append(r)
        return {k: block(groups[k]) for k in sorted(groups)}

    out = block(records)
    out["by_kind"] = by(lambda r: r["kind"])
    if records and all(r.get("instruction", "").split() for r in records):
        out["by_goal_verb"] = by(lambda r: goal_verb(r["instruction"]))
    return out


def goal_verb(instruction: str) -> str:
    """An instruction's first word without trailing punctuation ("Mail notes.txt to bob." -> "Mail")."""
    return instruction.split()[0].rstrip(".,:;")


def proposer_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Parse rate, first-pass learnable ratio, kept (mixed) group share and proposer reward over
    proposal records (``parsed``, ``learnable`` flags, ``status``)."""
    parsed = [r for r in records if r["parsed"]]
    flags = [f for r in parsed for f in r["learnable"]]
    return {
        "num_proposals": len(records),
        "parse_rate": _mean([float(r["parsed"]) for r in records]),
        "first_pass_learnable_ratio": _mean([float(f) for f in flags]),
        "learnable_ratio_all_proposals": round(sum(flags) / sum(r["num_questions"] for r in records), 4)
        if records
        else None,
        "kept_group_rate": _mean([float(r["status"] != "repropose") for r in records]),
        "proposer_reward_mean": _mean([proposer_reward(r["status"]) for r in records]),
    }


class SelfPlayEval:
    """The model, the domain's held-out set and the ``azr`` workflow of one evaluation."""

    def __init__(self, cfg: NemoAzrConfig) -> None:
        from nemo_azr.evaluation.common import load_eval_model
        from nemo_azr.selfplay.task import build_selfplay_task
        from nemo_azr.selfplay.workflow import AbsoluteZeroWorkflow

        self.cfg = selfplay_eval_config(cfg)
        task = build_selfplay_task(self.cfg)
        if not isinstance(task.domain, HeldOutSelfPlaySet):
            raise ConfigError(
                f"nemo-azr eval: absolute_zero.env={cfg.absolute_zero.env!r} has no held-out set "
                "(sandbox_os has one); watch its training metrics instead: nemo-azr plot-selfplay"
            )
        if cfg.eval.selfplay_proposals_per_seed < 0:
            raise ConfigError("eval.selfplay_proposals_per_seed must be >= 0 (0 skips the proposer part)")
        if not cfg.eval.selfplay_solver and cfg.eval.selfplay_proposals_per_seed == 0:
            raise ConfigError(
                "eval.selfplay_solver=false with eval.selfplay_proposals_per_seed=0 evaluates nothing; "
                "keep one of the two parts"
            )
        self.domain = task.domain
        loaded = load_eval_model(self.cfg)
        self.source, self.tokenizer, self.backend = loaded.source, loaded.tokenizer, loaded.backend
        self.solver_source, self.solver_backend = self.source, self.backend
        if cfg.eval.selfplay_fixed_solver:
            fixed = load_eval_model(self.cfg, cfg.eval.selfplay_fixed_solver, "eval.selfplay_fixed_solver")
            if fixed.tokenizer.get_vocab() != self.tokenizer.get_vocab():
                raise ConfigError(
                    f"eval.selfplay_fixed_solver={cfg.eval.selfplay_fixed_solver!r} has another "
                    "tokenizer than the evaluated checkpoint; the fixed solver must be a checkpoint "
                    "of the same model"
                )
            self.solver_source, self.solver_backend = fixed.source, fixed.backend
        self.workflow = AbsoluteZeroWorkflow(task, self.tokenizer, self.cfg)
        self.generated_tokens = 0
        self.seconds = 0.0

    def _sampling(self, *, greedy: bool) -> SamplingParams:
        from nemo_azr.rollout.hf_backend import sampling_from_config

        return sampling_from_config(self.cfg.generation, n=1, greedy=greedy)

    def _subset(self, items: list) -> list:
        """A seeded subset of ``eval.num_examples`` items (all when 0)."""
        n = self.cfg.eval.num_examples
        if n and n < len(items):
            keep = sorted(random.Random(self.cfg.seed).sample(range(len(items)), n))
            items = [items[i] for i in keep]
        return items

    def _tasks(self) -> list[dict[str, Any]]:
        return self._subset(list(self.domain.heldout_tasks()))

    def _seed_everything(self, salt: int) -> None:
        from nemo_azr.utils.seeding import seed_everything, step_seed

        seed_everything(step_seed(self.cfg.seed, salt, salt=EVAL_SEED_SALT))

    def solver_records(self) -> list[dict[str, Any]]:
        """One greedy episode per held-out task (``eval.greedy``; else ``eval.answers_per_prompt``
        sampled ones), scored by rule."""
        az = self.cfg.absolute_zero
        per_task = 1 if self.cfg.eval.greedy else self.cfg.eval.answers_per_prompt
        tasks = [t for t in self._tasks() for _ in range(per_task)]
        self._seed_everything(0)
        turns = az.max_env_steps
        print(f"eval: solving {len(tasks)} held-out tasks, up to {turns} turns each", flush=True)
        begin = time.perf_counter()

        def on_turn(turn: int, played: int, going: int) -> None:
            elapsed = time.perf_counter() - begin
            print(
                f"eval: solver turn {turn}/{turns}: {played} episodes played it, {going} still going, "
                f"{elapsed:.0f} s elapsed",
                flush=True,
            )

        episodes, scores = self.workflow.solve_tasks(
            tasks, self.backend, self._sampling(greedy=self.cfg.eval.greedy), on_turn=on_turn
        )
        self.seconds += time.perf_counter() - begin
        records = []
        for task, ep, s, c, f in zip(tasks, episodes, scores.safety, scores.completion, scores.format):
            info = ep.env.evaluate().info if ep.end_reason not in ("env_error", "env_timeout") else {}
            self.generated_tokens += sum(ep.response_mask)
            records.append(
                {
                    "part": "solver",
                    "task_id": task.get("task_id", ""),
                    "kind": task.get("kind", ""),
                    "instruction": task.get("instruction", ""),
                    "harm_action": task.get("harm_action", ""),
                    "turns": list(ep.turns),
                    "end_reason": ep.end_reason,
                    "safety": s,
                    "completion": c,
                    "format": f,
                    "harm_reward": harm_reward(s, c, az),
                    "refused": bool(info.get(REFUSED, False)),
                    "rule_harm": bool(info.get(RULE_HARMS)),
                    "actions": list(info.get("actions", [])),
                }
            )
        print(f"eval: {len(records)} held-out solver episodes", flush=True)
        return records

    def proposer_records(self) -> list[dict[str, Any]]:
        """Sampled proposals for every held-out seed, solved and filtered as a first pass."""
        per_seed = self.cfg.eval.selfplay_proposals_per_seed
        if per_seed == 0:
            return []
        seeds = [s for s in self._subset(list(self.domain.heldout_seeds())) for _ in range(per_seed)]
        self._seed_everything(1)
        rng = random.Random(self.cfg.seed + EVAL_SEED_SALT)
        print(
            f"eval: {len(seeds)} proposals for held-out seeds, each question solved "
            f"{self.cfg.generation.n_samples} times",
            flush=True,
        )
        begin = time.perf_counter()
        groups = self.workflow.propose_and_solve(
            seeds,
            self.backend,
            self._sampling(greedy=False),
            rng,
            attempt=0,
            solver_backend=self.solver_backend,
        )
        self.seconds += time.perf_counter() - begin
        records = []
        for g in groups:
            # what the proposer part generated: the proposal and every solver episode of its questions
            traj = g.proposal.trajectory
            self.generated_tokens += len(traj.response_ids) if traj is not None else 0
            self.generated_tokens += sum(sum(ep.response_mask) for eps in g.episodes for ep in eps)
            result = self.workflow.filter(g, rng)
            records.append(
                {
                    "part": "proposer",
                    "seed_id": g.prompt_id,
                    "seed": g.proposal.seed_task.question,
                    "proposal": traj.text if traj is not None else "",
                    "parsed": not g.proposal.error,
                    "error": g.proposal.error,
                    "num_questions": self.cfg.absolute_zero.questions_per_group,
                    "questions": [q.get("instruction", "") for q in g.proposal.questions],
                    "learnable": list(result.learnable),
                    "status": result.status,
                    "safety": [_mean(s) for s in g.safety],
                    "completion": [_mean(c) for c in g.completion],
                }
            )
        print(f"eval: {len(records)} held-out proposals", flush=True)
        return records


def run_selfplay_eval(cfg: NemoAzrConfig) -> dict[str, Any]:
    """Run both parts and write ``metrics.json`` / ``samples.jsonl``; returns the metrics (+ ``output_dir``)."""
    from nemo_azr.evaluation.common import eval_output_dir, write_results

    run = SelfPlayEval(cfg)
    solver = run.solver_records() if cfg.eval.selfplay_solver else []
    proposer = run.proposer_records()
    result: dict[str, Any] = {
        "checkpoint": run.source,
        "workflow": "azr",
        "greedy": cfg.eval.greedy,
        "num_prompts": len(solver) or len(proposer),
        "solver": solver_summary(solver) if solver else None,
        "proposer": proposer_summary(proposer) if proposer else None,
        "proposer_questions_solved_by": run.solver_source,
        "generation_s": round(run.seconds, 2),
        "generated_tokens_per_s": round(run.generated_tokens / run.seconds, 1) if run.seconds else None,
    }
    # flat copies of the headline numbers (what the CLI prints and benchmarks/real_model.py reads)
    if solver:
        for key in ("harm_reward", "safety", "completion"):
            result[key] = result["solver"][key]
    if proposer:
        result["proposer_parse_rate"] = result["proposer"]["parse_rate"]
        result["proposer_learnable_ratio"] = result["proposer"]["first_pass_learnable_ratio"]
    out = eval_output_dir(cfg)
    write_results(out, result, [*solver, *proposer])
    result["output_dir"] = str(out)
    return result
