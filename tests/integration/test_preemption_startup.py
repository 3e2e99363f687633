"""A preemption signal (SIGTERM / SIGUSR1) at each start-up phase of `nemo-azr train`: exit 75 with one
clean line, a checkpoint exactly when there is something to keep, and a following run that finishes
and logs what an uninterrupted run logs.

The signals are real (``os.kill`` on this process, from inside the phase, through the CLI's own
handler); an in-process run places them at an exact phase, which a subprocess could only hit by
timing. test_preemption_wandb.py sends one from outside to a ``python -m nemo_azr`` process.
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

import nemo_azr.preflight as config_loader
from nemo_azr.cli import main as nemo_azr_main
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.trainer.checkpointing import SFT_WARMUP_FILE
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.preemption import EXIT_PREEMPTED
from nemo_azr.trainer.trainer import Trainer

WARMUP = 4
STEPS = 2


def _overrides(tiny_cache, out, *extra):
    return [
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={STEPS}",
        f"sft_warmup.steps={WARMUP}",
        "sft_warmup.batch_size=8",
        "data.prompts_per_step=2",
        "generation.n_samples=4",
        *extra,
    ]


@pytest.fixture(autouse=True)
def _restore_signal_handlers():
    """A run that exits for requeue keeps its handler (a second signal is ignored); put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _signal_self(signum=signal.SIGTERM):
    # Without a handler the default action would end the test process itself.
    assert callable(signal.getsignal(signum)), f"no handler for {signum!r}: the trainer would die"
    os.kill(os.getpid(), signum)


def _train(capsys, tiny_cache, out, *extra):
    capsys.readouterr()
    rc = nemo_azr_main(["train", *_overrides(tiny_cache, out, *extra)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.out, captured.err


def _steps(out):
    root = out / "checkpoints"
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) if root.is_dir() else []


def _comparable(out):
    return without_machine_metrics(read_metrics(out / "metrics.jsonl"))


@pytest.fixture(scope="module")
def uninterrupted(tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    assert nemo_azr_main(["train", *_overrides(tiny_cache, out)]) == 0
    return _comparable(out)


@pytest.mark.parametrize("phase", ["start-up", "model build"])
def test_signal_before_the_model_exists_requeues_with_nothing_saved(
    phase, tiny_cache, tmp_path, capsys, monkeypatch, uninterrupted
):
    if phase == "start-up":  # while the config is composed
        real_load_config = config_loader.load_config

        def load_config(overrides):
            _signal_self()
            return real_load_config(overrides)

        monkeypatch.setattr(config_loader, "load_config", load_config)
    else:  # the policy model has been built, the reference model not yet
        real_init = HFPolicy.__init__

        def init(self, *args, **kwargs):
            real_init(self, *args, **kwargs)
            _signal_self()

        monkeypatch.setattr(HFPolicy, "__init__", init)
    out = tmp_path / "run"
    rc, _, err = _train(capsys, tiny_cache, out)
    assert rc == EXIT_PREEMPTED
    assert f"nemo-azr: SIGTERM during {phase}: nothing to save yet, exiting for requeue" in err
    assert _steps(out) == []
    monkeypatch.undo()
    rc, stdout, _ = _train(capsys, tiny_cache, out)  # the requeued job
    assert rc == 0 and f"completed at step {STEPS}" in stdout
    assert _comparable(out) == uninterrupted


def test_signal_while_the_resume_checkpoint_loads(tiny_cache, tmp_path, capsys, monkeypatch, uninterrupted):
    out = tmp_path / "run"
    rc, _, _ = _train(capsys, tiny_cache, out, "trainer.max_steps_per_run=1")
    assert rc == EXIT_PREEMPTED and _steps(out) == ["step_1"]  # a slice: paused after step 1
    done = out / "checkpoints" / "step_1" / "COMPLETE"
    mtime = done.stat().st_mtime_ns

    real_load = HFPolicy.load

    def load(self, folder):
        real_load(self, folder)
        _signal_self()

    monkeypatch.setattr(HFPolicy, "load", load)
    rc, stdout, err = _train(capsys, tiny_cache, out)
    assert rc == EXIT_PREEMPTED
    assert "nemo-azr: SIGTERM during resume load: nothing new to save, exiting for requeue" in err
    assert "preempted at step" in stdout
    assert _steps(out) == ["step_1"] and done.stat().st_mtime_ns == mtime  # nothing rewritten
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1]  # no step trained
    monkeypatch.undo()
    rc, stdout, _ = _train(capsys, tiny_cache, out)
    assert rc == 0 and f"completed at step {STEPS}" in stdout
    assert _comparable(out) == uninterrupted


def test_signal_during_warmup_saves_a_resumable_warmup_checkpoint(
    tiny_cache, tmp_path, capsys, monkeypatch, uninterrupted
):
    real_step = HFPolicy.sft_step
    calls, armed = [], [True]  # one signal, in the first run

    def sft_step(self, batch, optimizer):
        loss = real_step(self, batch, optimizer)
        calls.append(loss)
        if len(calls) == 2 and armed[0]:
            armed[0] = False
            _signal_self(signal.SIGUSR1)  # SLURM's time-limit signal, in the middle of the warm-up
        return loss

    monkeypatch.setattr(HFPolicy, "sft_step", sft_step)
    out = tmp_path / "run"
    rc, _, err = _train(capsys, tiny_cache, out)
    assert rc == EXIT_PREEMPTED
    assert len(calls) == 2  # stopped after the step in which the signal came
    ckpt = out / "checkpoints" / "step_0"
    assert (
        f"nemo-azr: SIGUSR1 during supervised warm-up: saved {ckpt} (warm-up step 2 of {WARMUP}; "
        "a resume continues it), exiting for requeue"
    ) in err
    assert _steps(out) == ["step_0"] and (ckpt / "COMPLETE").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["warmup_step"] == 2
    warmup_state = torch.load(ckpt / SFT_WARMUP_FILE, weights_only=False)
    assert warmup_state["step"] == 2 and warmup_state["optimizer"]["state"]  # AdamW moments kept

    calls.clear()  # the requeued job (still counting warm-up steps, no more signals)
    rc, stdout, err = _train(capsys, tiny_cache, out)
    assert rc == 0 and f"completed at step {STEPS}" in stdout
    assert len(calls) == WARMUP - 2  # only the remaining warm-up steps
    assert f"supervised warm-up: {WARMUP - 2} steps (resumed after step 2)" in err
    # said before the warm-up starts, not after it (the logger starts after it)
    announced = f"supervised warm-up: {WARMUP} steps, continuing after step 2 from {ckpt}"
    assert announced in err and err.index(announced) < err.index("resumed after step 2")
    # Same data, same optimizer state, same random draws: as if never interrupted.
    assert _comparable(out) == uninterrupted
    final = json.loads((out / "checkpoints" / f"step_{STEPS}" / "trainer_state.json").read_text())
    assert final["warmup_step"] is None
    assert not (out / "checkpoints" / f"step_{STEPS}" / SFT_WARMUP_FILE).exists()


def test_signal_after_warmup_before_the_first_step_saves_the_warmed_up_weights(
    tiny_cache, tmp_path, capsys, monkeypatch, uninterrupted
):
    real_setup = Trainer.setup_generation

    def setup_generation(self):
        _signal_self()
        real_setup(self)

    monkeypatch.setattr(Trainer, "setup_generation", setup_generation)
    out = tmp_path / "run"
    rc, _, err = _train(capsys, tiny_cache, out)
    ckpt = out / "checkpoints" / "step_0"
    assert rc == EXIT_PREEMPTED
    assert f"nemo-azr: SIGTERM during generation set-up: saved {ckpt}, exiting for requeue" in err
    assert _steps(out) == ["step_0"]
    assert json.loads((ckpt / "trainer_state.json").read_text())["warmup_step"] is None
    assert not (ckpt / SFT_WARMUP_FILE).exists()
    monkeypatch.undo()

    warmups = []
    real_step = HFPolicy.sft_step
    monkeypatch.setattr(HFPolicy, "sft_step", lambda *a: warmups.append(1) or real_step(*a))
    rc, stdout, _ = _train(capsys, tiny_cache, out)
    assert rc == 0 and f"completed at step {STEPS}" in stdout
    assert warmups == []  # the warm-up is in step_0, not repeated
    assert _comparable(out) == uninterrupted


def test_signal_during_wandb_init(tiny_cache, tmp_path, capsys, monkeypatch, uninterrupted):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the config must win: an offline run is offline
    seen = []
    real_init = wandb.init

    def init(*args, **kwargs):
        seen.append(os.environ.get("WANDB_MODE"))
        _signal_self()
        return real_init(*args, **kwargs)

    monkeypatch.setattr(wandb, "init", init)
    out = tmp_path / "run"
    rc, _, err = _train(capsys, tiny_cache, out, "logger.wandb.enabled=true", "logger.wandb.mode=offline")
    ckpt = out / "checkpoints" / "step_0"
    assert rc == EXIT_PREEMPTED
    assert seen == ["offline"]  # WANDB_MODE comes from the config before wandb starts its service
    assert os.environ["WANDB_MODE"] == "disabled"  # and is given back afterwards
    assert f"nemo-azr: SIGTERM during logger start-up (W&B init): saved {ckpt}, exiting for requeue" in err
    assert _steps(out) == ["step_0"]
    assert any((out / "wandb").glob("offline-run-*"))
    monkeypatch.undo()
    wandb.teardown()  # stop this process's W&B service (and its token in the environment)
    rc, stdout, _ = _train(capsys, tiny_cache, out)
    assert rc == 0 and f"completed at step {STEPS}" in stdout
    assert _comparable(out) == uninterrupted


def test_a_stopped_warmup_continues_exactly(tiny_cache, tmp_path):
    """Stopped after 2 of 4 steps and continued by a new process (a new workflow, whose warm-up
    targets come from its own random draws: RLCR's deliberately wrong answers and confidences),
    the warm-up takes the same steps as in one go (the arithmetic task's is checked through `fit`
    above)."""
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.sft import SFTWarmup

    cfg = load_config(
        [
            "experiment=rlcr_two_turn",
            f"model.tiny.cache_dir={tiny_cache}",
            f"trainer.output_dir={tmp_path}",
            "sft_warmup.steps=4",
            "sft_warmup.batch_size=2",
            "algorithm.kl.coef=0",
        ]
    )

    def warmup():
        t = Trainer(cfg)
        return t, SFTWarmup(t.policy, t.task, t.tokenizer, cfg, workflow=t.workflow)

    t, whole = warmup()
    whole.run()
    expected = {k: v.clone() for k, v in t.policy.model.state_dict().items()}

    t, first = warmup()
    first.run(should_stop=lambda: first.step == 2)
    assert first.step == 2 and not first.done
    state, weights = first.state_dict(), t.policy.model.state_dict()

    t, rest = warmup()
    t.policy.model.load_state_dict(weights)
    rest.load_state_dict(state)
    rest.run()
    assert rest.done and first.losses + rest.losses == whole.losses
    for k, v in t.policy.model.state_dict().items():
        assert torch.equal(v, expected[k]), k
