"""A run of 2N steps equals N steps + (preempt, checkpoint) + resume + N steps, metric for metric."""

import signal

import pytest

from nemo_azr.preflight import load_config
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.trainer import Trainer

N = 3


def _overrides(tiny_cache, out, warmup_steps=5):
    return [
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={2 * N}",
        "trainer.save_interval=0",
        f"sft_warmup.steps={warmup_steps}",
        "data.prompts_per_step=4",
        "generation.n_samples=4",
        "algorithm.mini_batch_size=8",  # two optimizer steps per RL step: order and Adam state matter
        "algorithm.ppo_epochs=2",
        "algorithm.kl.coef=0.05",  # exercises the frozen reference policy
        "optim.schedule=cosine",
        "optim.warmup_steps=2",
    ]


class _PreemptedTrainer(Trainer):
    """Receives a preemption signal during step N-1 (as SLURM would send SIGUSR1)."""

    def train_step(self, step):
        metrics = super().train_step(step)
        if step == N - 1:
            self.preemption.signum = signal.SIGUSR1
        return metrics


def _comparable(records):
    return without_machine_metrics(records)


@pytest.mark.slow
def test_resume_reproduces_an_uninterrupted_run(tiny_cache, tmp_path):
    full = tmp_path / "full"
    Trainer(load_config(_overrides(tiny_cache, full))).fit()

    split = tmp_path / "split"
    first = _PreemptedTrainer(load_config(_overrides(tiny_cache, split))).fit()
    assert first.status == "preempted" and first.step == N
    assert first.checkpoint.name == f"step_{N}"
    second = Trainer(load_config(_overrides(tiny_cache, split))).fit()
    assert second.status == "completed" and second.step == 2 * N

    a = _comparable(read_metrics(full / "metrics.jsonl"))
    b = _comparable(read_metrics(split / "metrics.jsonl"))
    assert [r["step"] for r in b] == list(range(1, 2 * N + 1))
    assert a == b
    # What the model wrote is logged too (logger.samples_per_step, default 4 rows per step, from 4
    # different prompts), and a resumed run rewrites exactly the steps after its checkpoint.
    samples_full, samples_split = read_metrics(full / "samples.jsonl"), read_metrics(split / "samples.jsonl")
    assert samples_full == samples_split
    assert [r["step"] for r in samples_full] == [step for step in range(1, 2 * N + 1) for _ in range(4)]
    for step in range(1, 2 * N + 1):
        rows = [r for r in samples_full if r["step"] == step]
        assert len({r["group_id"] for r in rows}) == 4 and all(
            r["prompt"].startswith("What is") for r in rows
        )
        assert all(isinstance(r["response"], str) and r["reward"] in (0.0, 1.0) for r in rows)
    # the runs really trained: the policy moved and rewards were observed at every step
    assert all("reward/mean" in r and "actor/pg_loss" in r for r in a)


@pytest.mark.slow
def test_ppo_resume_with_its_critic_reproduces_an_uninterrupted_run(tiny_cache, tmp_path):
    """Policy and critic (weights, both optimizers, both schedules) come back from the checkpoint."""
    extra = [
        "algorithm=ppo",
        "critic.optim.schedule=cosine",
        "critic.optim.warmup_steps=1",
        "critic.warmup_steps=1",
    ]
    # a warm-up long enough for answers the strict reader reads, so returns (and the critic) vary
    warm = 60
    full = tmp_path / "full"
    Trainer(load_config([*_overrides(tiny_cache, full, warm), *extra])).fit()
    split = tmp_path / "split"
    first = _PreemptedTrainer(load_config([*_overrides(tiny_cache, split, warm), *extra])).fit()
    assert first.status == "preempted" and (first.checkpoint / "critic" / "model.safetensors").is_file()
    Trainer(load_config([*_overrides(tiny_cache, split, warm), *extra])).fit()
    a = _comparable(read_metrics(full / "metrics.jsonl"))
    b = _comparable(read_metrics(split / "metrics.jsonl"))
    assert a == b
    assert a[0]["critic/warmup"] == 1.0 and "actor/loss" not in a[0]  # step 0 trained the critic only
    assert all("critic/vf_loss" in r and "critic/explained_variance" in r for r in a)
    assert all("actor/pg_loss" in r for r in a[1:])
    assert len({r["critic/values_mean"] for r in a}) == len(a)  # the critic changed every step
