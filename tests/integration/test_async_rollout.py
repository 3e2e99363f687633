"""Asynchronous rollout: lag 0 equals the synchronous run, lag 1 trains one version behind with the
rollout importance weights, a stale batch is never trained on, checkpoints keep the trained position."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from nemo_azr.preflight import load_config
from nemo_azr.trainer.async_rollout import AsyncRollout, Rollout, check_lag
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.trainer import Trainer


def _cfg(tiny_cache, out, *extra):
    return load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={out}",
            "trainer.max_steps=4",
            "sft_warmup.steps=20",
            "data.prompts_per_step=4",
            "generation.n_samples=4",
            *extra,
        ]
    )


def _fit(tiny_cache, out, *extra):
    trainer = Trainer(_cfg(tiny_cache, out, *extra))
    result = trainer.fit()
    assert result.status == "completed" and result.step == 4
    return trainer, read_metrics(out / "metrics.jsonl")


@pytest.mark.parametrize("where", ["thread", "process"])
def test_lag_zero_equals_the_synchronous_run(tiny_cache, tmp_path, where):
    sync, m_sync = _fit(tiny_cache, tmp_path / "sync")
    lag0, m_lag0 = _fit(
        tiny_cache, tmp_path / "lag0", "rollout.async_rollout=true", "rollout.max_policy_lag=0",
        f"rollout.async_generation={where}",
    )  # fmt: skip
    assert lag0.backend.__class__.__name__ == "HFGenerationBackend"  # the process was stopped
    assert any(r["reward/mean"] > 0 for r in m_sync)  # the steps train on something
    for a, b in zip(m_sync, m_lag0, strict=True):
        assert b["async/policy_lag"] == 0.0
        for key in ("reward/mean", "actor/loss", "actor/grad_norm", "response/length_mean"):
            assert a[key] == b[key], key
    for (name, p), q in zip(sync.policy.model.named_parameters(), lag0.policy.model.parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("where", ["thread", "process"])
def test_lag_one_trains_one_version_behind_with_importance_weights(tiny_cache, tmp_path, where):
    _, records = _fit(
        tiny_cache, tmp_path, "rollout.async_rollout=true", "rollout.max_policy_lag=1",
        "algorithm.off_policy_correction=tis", "algorithm.is_cap=2.0", f"rollout.async_generation={where}",
    )  # fmt: skip
    lags = [r["async/policy_lag"] for r in records]
    assert lags[0] == 0.0 and max(lags) == 1.0 and all(lag <= 1 for lag in lags)
    for r in records:
        assert r["async/dropped_stale"] == 0.0
        assert math.isfinite(r["actor/loss"]) and r["actor/optimizer_steps"] == 1.0
        assert r["off_policy/is_weight_mean"] > 0 and r["off_policy/is_weight_max"] <= 2.0
    # One version behind, the rollout weights differ from pi_old: the ratio moves off 1.
    assert max(r["off_policy/log_ratio_abs_mean"] for r in records[1:]) > 0


def test_a_stale_batch_is_never_trained_on(tiny_cache, tmp_path):
    trainer = Trainer(_cfg(tiny_cache, tmp_path, "sft_warmup.steps=0"))
    trainer.setup_generation()
    rollout = trainer.produce_rollout(0)
    rollout.policy_version = -2  # generated two versions before the policy's 0
    stale = check_lag(rollout, trainer.state.policy_version, max_policy_lag=1)
    assert stale.batch is None and stale.lag_metrics == {"async/policy_lag": 2.0, "async/dropped_stale": 1.0}
    before = [p.detach().clone() for p in trainer.policy.model.parameters()]
    metrics = trainer._train_on(0, stale)
    assert metrics["trainer/step_skipped"] == 1.0 and "actor/loss" not in metrics
    assert all(torch.equal(p, q) for p, q in zip(before, trainer.policy.model.parameters()))
    # Within the bound it is kept as it is.
    rollout.policy_version = -1
    assert check_lag(rollout, 0, max_policy_lag=1) is rollout


def test_producer_errors_reach_the_trainer_and_order_is_kept():
    class Backend:
        version = 0

    def produce(step: int) -> Rollout:
        if step == 2:
            raise ValueError("reward server down")
        return Rollout(step=step, batch=None, metrics={}, skip=("x", "y"))

    producer = AsyncRollout(produce, Backend(), start_step=0, end_step=4, max_policy_lag=1, seed=0)
    try:
        assert producer.take(0, 0).step == 0
        producer.step_done(0)
        assert producer.take(1, 0).step == 1
        producer.step_done(1)
        with pytest.raises(ValueError, match="reward server down"):
            producer.take(2, 0)
    finally:
        producer.close()


def test_checkpoint_keeps_the_data_position_of_the_trained_batches(tiny_cache, tmp_path):
    every_2 = ["trainer.save_interval=2", "trainer.keep_last=5"]
    _fit(tiny_cache, tmp_path / "sync", *every_2)
    _fit(tiny_cache, tmp_path / "async", *every_2, "rollout.async_rollout=true", "rollout.max_policy_lag=1")

    def loader_state(run: str, step: int) -> dict:
        state = json.loads(
            (tmp_path / run / "checkpoints" / f"step_{step}" / "trainer_state.json").read_text()
        )
        return state["loader"]

    for step in (2, 4):  # at step 2 the producer has already drawn step 2's prompts (one ahead)
        assert loader_state("async", step) == loader_state("sync", step)


LAG1_TIS = ["rollout.async_rollout=true", "rollout.max_policy_lag=1", "algorithm.off_policy_correction=tis",
            "algorithm.is_cap=2.0", "trainer.max_steps=5"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("where", ["thread", "process"])
def test_lag_one_stopped_and_resumed_equals_the_uninterrupted_run(tiny_cache, tmp_path, where):
    """Slices of 2 steps (each ends with a checkpoint and a new process-like start) and a signal
    after the first step of a slice: the batches the producer sampled ahead with older weights are
    kept in the checkpoint, so every step trains on what the uninterrupted run trained on."""
    extra = [*LAG1_TIS, f"rollout.async_generation={where}"]
    full, m_full = _fit_steps(tiny_cache, tmp_path / "full", *extra)

    out = tmp_path / "stopped"
    first = Trainer(_cfg(tiny_cache, out, *extra, "trainer.max_steps_per_run=2"))
    assert first.fit().status == "paused"  # steps 0-1; the producer had sampled step 2 already
    saved = torch.load(out / "checkpoints" / "step_2" / "async_in_flight.pt", weights_only=False)
    assert [r.step for r in saved["rollouts"]] == [2] and saved["rollouts"][0].policy_version == 1
    second = Trainer(_cfg(tiny_cache, out, *extra))
    original = second.train_step

    def stop_after_one(step):  # a preemption signal during step 2: save after it, exit
        metrics = original(step)
        second.preemption.signum = signal.SIGTERM
        return metrics

    second.train_step = stop_after_one
    assert second.fit().status == "preempted"
    third = Trainer(_cfg(tiny_cache, out, *extra))
    assert third.fit().status == "completed"

    m_stopped = without_machine_metrics(read_metrics(out / "metrics.jsonl"))
    assert [r["step"] for r in m_stopped] == list(range(1, 6))
    assert without_machine_metrics(m_full) == m_stopped
    assert max(r["off_policy/log_ratio_abs_mean"] for r in m_stopped[1:]) > 0  # really one version behind
    for (name, p), q in zip(full.policy.model.named_parameters(), third.policy.model.parameters()):
        assert torch.equal(p, q), name


def _fit_steps(tiny_cache, out, *extra):
    trainer = Trainer(_cfg(tiny_cache, out, *extra))
    assert trainer.fit().status == "completed"
    return trainer, read_metrics(out / "metrics.jsonl")
