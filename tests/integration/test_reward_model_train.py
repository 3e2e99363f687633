"""Seed 004 class 4 end to end on the tiny model: ``nemo-azr train-rm`` learns to rank held-out
pairs, and RL with its score as the reward trains exactly as the same scores given as the task's
rule reward would (same advantages, losses and gradients, step by step)."""

from __future__ import annotations

import json

import pytest
import torch

from nemo_azr.cli import main
from nemo_azr.preflight import load_config
from nemo_azr.rewards.reward_model import RewardModel
from nemo_azr.tasks.preference_data import PreferencePair, write_pairs_jsonl
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.trainer import Trainer

# chosen replies answer politely, rejected ones refuse: a pattern the tiny model can learn quickly
PAIRS = [
    PreferencePair(f"p{i}", f"Question number {i}: what is {i} + {i}?", f"Sure, it is {2 * i}.", "No.")
    for i in range(60)
]


@pytest.fixture(scope="module")
def trained_rm(tiny_cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    write_pairs_jsonl(PAIRS, root / "pairs.jsonl")
    status = main(
        [
            "train-rm",
            f"model.tiny.cache_dir={tiny_cache}",
            f"trainer.output_dir={root}",
            f"preference.pairs_path={root / 'pairs.jsonl'}",
            "reward_model.train_steps=20",
            "reward_model.train_lr=1e-3",
            "reward_model.heldout_pairs=20",
            "reward_model.eval_every=10",
        ]
    )
    assert status == 0
    return root / "reward_model"


def test_train_rm_ranks_held_out_pairs_and_writes_a_reward_model(trained_rm):
    final = json.loads((trained_rm / "rm_metrics.json").read_text())
    assert final["train_pairs"] == 40 and final["heldout_pairs"] == 20
    assert final["heldout/accuracy"] == 1.0 and final["heldout/loss"] < final["heldout/loss_before"]
    log = [json.loads(line) for line in (trained_rm / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == list(range(21)) and "heldout/accuracy" in log[10]
    # the written folder scores as a reward model: every pair, held out or not, ranked right
    scorer = RewardModel(trained_rm)
    chats = [[{"role": "user", "content": p.prompt}] for p in PAIRS]
    chosen = scorer.score(chats, [p.chosen for p in PAIRS])
    rejected = scorer.score(chats, [p.rejected for p in PAIRS])
    assert bool((chosen > rejected).all())
    assert not (trained_rm.parent / "reward_model.tmp").exists()


def _rl(tiny_cache, out, *extra):
    return load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={out}",
            "sft_warmup.steps=0",
            "trainer.max_steps=2",
            "data.prompts_per_step=4",
            *extra,
        ]
    )


def test_rl_with_the_reward_model_equals_its_scores_as_rule_rewards(tiny_cache, tmp_path, trained_rm):
    with_rm = Trainer(_rl(tiny_cache, tmp_path / "rm", f"reward_model.path={trained_rm}"))
    assert with_rm.fit().status == "completed"

    as_rule = Trainer(_rl(tiny_cache, tmp_path / "rule"))
    scorer, task = RewardModel(trained_rm), as_rule.task
    task.reward = lambda ex, text: float(scorer.score([task.messages(ex)], [text])[0])  # one reply at a time
    assert as_rule.fit().status == "completed"

    got = without_machine_metrics(read_metrics(tmp_path / "rm" / "metrics.jsonl"))
    want = without_machine_metrics(read_metrics(tmp_path / "rule" / "metrics.jsonl"))
    # the same model in a process of its own: the same run
    own_process = Trainer(
        _rl(
            tiny_cache,
            tmp_path / "rm_proc",
            f"reward_model.path={trained_rm}",
            "reward_model.placement=process",
        )
    )
    assert own_process.fit().status == "completed"
    assert without_machine_metrics(read_metrics(tmp_path / "rm_proc" / "metrics.jsonl")) == got
    for g, w in zip(got, want, strict=True):
        assert g["reward/model_score_mean"] == pytest.approx(w["reward/mean"], abs=1e-5)
        assert 0.0 <= g["reward/rule_mean"] <= 1.0  # the task's accuracy, logged beside the model's score
        for key in ("reward/mean", "advantage/abs_mean", "actor/pg_loss", "actor/grad_norm"):
            assert g[key] == pytest.approx(w[key], rel=1e-4, abs=1e-6), key
    samples = [json.loads(line) for line in (tmp_path / "rm" / "samples.jsonl").read_text().splitlines()]
    sample = samples[0]
    ex = next(e for e in with_rm.task.examples if e.question == sample["prompt"])
    assert sample["reward"] == pytest.approx(
        float(scorer.score([task.messages(ex)], [sample["response"]])[0]), abs=1e-5
    )


def test_per_token_rewards_reach_the_critic_run(tiny_cache, tmp_path, trained_rm):
    """PPO with GAE on per-token scores, the model in its own process: each response token's reward
    is the change of the reward model's score it caused, as the model gives it in this process."""
    from nemo_azr.contracts import fields as F
    from nemo_azr.trainer.model_rewards import score_differences

    trainer = Trainer(
        _rl(
            tiny_cache,
            tmp_path / "dense",
            "algorithm=ppo",
            f"reward_model.path={trained_rm}",
            "reward_model.per_token=true",
            "reward_model.placement=process",
            "reward_model.weight=2.0",
        )
    )
    scored = []
    score = trainer._score
    trainer._score = lambda batch, metrics: scored.append(score(batch, metrics)) or scored[-1]
    assert trainer.fit().status == "completed"
    assert len(scored) == 2
    local = RewardModel(trained_rm)
    for batch in scored:
        token_scores = local.token_scores(batch[F.INPUT_IDS], batch[F.ATTENTION_MASK])
        want = 2.0 * score_differences(token_scores, batch[F.LOSS_MASK])
        assert batch[F.TOKEN_REWARDS].abs().sum() > 0
        torch.testing.assert_close(batch[F.TOKEN_REWARDS], want, atol=1e-5, rtol=0)
    rows = read_metrics(tmp_path / "dense" / "metrics.jsonl")
    assert all(r["critic/loss"] > 0 for r in rows)
