"""``nemo-azr sample-pairs``: preference pairs from the policy's own replies, ranked by the task's rule.

For each of ``preference.sample_prompts`` training problems (a seeded draw) the model that
``preference.sample_checkpoint`` names (``model``: the untrained ``model.path``; ``auto``: the run's
newest checkpoint; or a path) samples ``generation.n_samples`` replies at ``generation.temperature``
through the run's single-turn workflow, the task's rule reward scores them, and a best-scored reply
against a worst one becomes a pair (:func:`~nemo_azr.tasks.preference_data.pairs_from_scored_replies`);
a problem whose replies all score the same gives none. Pairs of the model's own formats and its own
mistakes are what a reward model (``nemo-azr train-rm preference.pairs_path=...``) or DPO needs to
learn what the rule prefers in what this policy writes, rather than in replies written for it.

Written: the pairs (``preference.sample_out``, default ``<trainer.output_dir>/sampled_pairs.jsonl``),
every scored reply next to them (``*.replies.jsonl``, to read what the model wrote), and a summary
(``*.summary.json``): problems, pairs, problems whose replies all scored alike (all right, all wrong).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.errors import ConfigError
from nemo_azr.tasks.preference_data import PreferencePair, pairs_from_scored_replies, write_pairs_jsonl

__all__ = ["pairs_from_records", "sample_pairs", "sampled_pairs_path"]

Progress = Callable[[str], None]


def sampled_pairs_path(cfg: NemoAzrConfig) -> Path:
    return Path(
        cfg.preference.sample_out or Path(cfg.trainer.output_dir) / "sampled_pairs.jsonl"
    ).expanduser()


def pairs_from_records(
    records: Sequence[dict[str, Any]], *, seed: int = 0
) -> tuple[list[PreferencePair], dict[str, int]]:
    """One pair per prompt whose replies' rewards differ (records: ``prompt_id``, ``question``,
    ``response``, ``reward``, in any order), and the counts: prompts, pairs, prompts whose replies
    all scored the same (``all_same``), of them those all right (reward >= 1, a rule's full score)
    and all wrong (reward <= 0), and empty replies (``empty``: left out of the pairs, whose file
    format needs text on both sides)."""
    by_prompt: dict[str, list[dict[str, Any]]] = {}
    empty = 0
    for record in records:
        if not record["response"].strip():
            empty += 1
            continue
        by_prompt.setdefault(record["prompt_id"], []).append(record)
    pairs: list[PreferencePair] = []
    counts = {
        "prompts": len(by_prompt),
        "pairs": 0,
        "all_same": 0,
        "all_right": 0,
        "all_wrong": 0,
        "empty": empty,
    }
    for index, (prompt_id, rows) in enumerate(by_prompt.items()):
        rewards = [r["reward"] for r in rows]
        pair = pairs_from_scored_replies(
            str(prompt_id), rows[0]["question"], [r["response"] for r in rows], rewards, seed=seed + index
        )
        if pair is not None:
            pairs.append(pair)
            continue
        counts["all_same"] += 1
        counts["all_right"] += rewards[0] >= 1.0
        counts["all_wrong"] += rewards[0] <= 0.0
    counts["pairs"] = len(pairs)
    return pairs, counts


def _check(cfg: NemoAzrConfig) -> None:
    if cfg.rollout.workflow != "single_turn":
        raise ConfigError(
            f"sample-pairs samples single-turn replies; rollout.workflow={cfg.rollout.workflow} is not one"
        )
    if cfg.generation.n_samples < 2:
        raise ConfigError(
            f"sample-pairs: generation.n_samples={cfg.generation.n_samples}; a pair needs at least 2 replies a problem"
        )
    if cfg.preference.sample_prompts < 1:
        raise ConfigError(f"preference.sample_prompts must be >= 1, got {cfg.preference.sample_prompts}")


def sample_pairs(cfg: NemoAzrConfig, progress: Progress = print) -> dict[str, Any]:
    """Sample, score, pair and write (see the module doc); returns the summary."""
    import nemo_azr.rlcr  # noqa: F401  (registers every workflow)
    from nemo_azr.evaluation.common import load_eval_model, sample_records
    from nemo_azr.registry import WORKFLOWS
    from nemo_azr.rollout.hf_backend import sampling_from_config
    from nemo_azr.tasks import build_task
    from nemo_azr.trainer.rewards import score_batch
    from nemo_azr.utils.seeding import seed_everything, step_seed

    _check(cfg)
    loaded = load_eval_model(cfg, cfg.preference.sample_checkpoint, "preference.sample_checkpoint")
    task = build_task(cfg.data, split="train")
    examples = list(task.examples)
    if cfg.preference.sample_prompts < len(examples):
        keep = sorted(random.Random(cfg.seed).sample(range(len(examples)), cfg.preference.sample_prompts))
        examples = [examples[i] for i in keep]
    workflow = WORKFLOWS.get(cfg.rollout.workflow)(task, loaded.tokenizer, cfg)
    sampling = sampling_from_config(cfg.generation, greedy=False)
    per_batch = max(1, cfg.eval.prompts_per_batch)
    records: list[dict[str, Any]] = []
    progress(
        f"sample-pairs: {len(examples)} problems x {cfg.generation.n_samples} replies from {loaded.source}"
    )
    for index, start in enumerate(range(0, len(examples), per_batch)):
        seed_everything(step_seed(cfg.seed, index))
        batch = workflow.run(examples[start : start + per_batch], loaded.backend, sampling, step=index)
        batch = score_batch(batch, task, errors="raise")
        records.extend(sample_records(batch))
        done = min(start + per_batch, len(examples))
        progress(f"sample-pairs: {done}/{len(examples)} problems, {len(records)} replies scored")
    pairs, counts = pairs_from_records(records, seed=cfg.seed)
    out = sampled_pairs_path(cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_pairs_jsonl(pairs, out)
    replies = out.with_suffix(".replies.jsonl")
    replies.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {
        **counts,
        "replies": len(records),
        "mean_reward": sum(r["reward"] for r in records) / len(records) if records else 0.0,
        "model": loaded.source,
        "pairs_path": str(out),
        "replies_path": str(replies),
    }
    out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    progress(
        f"sample-pairs: wrote {len(pairs)} pairs to {out} (no pair: {counts['all_right']} problems all right, "
        f"{counts['all_wrong']} all wrong, {counts['all_same'] - counts['all_right'] - counts['all_wrong']} "
        f"otherwise alike; mean reward {summary['mean_reward']:.3f})"
    )
    return summary
