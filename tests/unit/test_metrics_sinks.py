"""Metrics sinks fail soft (one warning, switched off, counted); W&B gets its mode from the config
before it starts; the resume rewrites of metrics.jsonl / samples.jsonl / the run id are atomic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from nemo_azr.config.schema import LoggerConfig, WandbConfig
from nemo_azr.trainer.metrics import (
    FAILED_SINKS_KEY,
    METRICS_FILE,
    MetricsLogger,
    read_metrics,
    truncate_jsonl,
)
from nemo_azr.trainer.samples import SAMPLES_FILE
from nemo_azr.utils.atomic_io import atomic_write_text


def _logger(tmp_path, *, start_step=0, **cfg):
    cfg = LoggerConfig(
        console=cfg.pop("console", False), wandb=cfg.pop("wandb", WandbConfig(enabled=False)), **cfg
    )
    return MetricsLogger(cfg, tmp_path, run_config={}, total_steps=10, start_step=start_step, run_name="t")


class _DeadWandbRun:
    """A W&B run whose service process is gone: every call raises, as wandb's own run does."""

    def __init__(self):
        self.logged = self.finished = 0

    def log(self, *args, **kwargs):
        self.logged += 1
        raise ConnectionResetError("Connection lost")

    def finish(self):
        self.finished += 1
        raise ConnectionResetError("Connection lost")


def test_a_failing_sink_is_switched_off_with_one_warning_and_counted(tmp_path, capsys):
    logger = _logger(tmp_path, console_interval=1)
    dead = _DeadWandbRun()
    logger._wandb = dead
    sample = [{"step": 0, "prompt": "p", "response": "r", "reward": 1.0}]
    for step in range(3):
        logger.log(step, {"reward/mean": 0.5})
        logger.log_samples(step, sample)
    logger.close()

    err = capsys.readouterr().err
    assert err.count("warning: the wandb metrics sink failed (ConnectionResetError: Connection lost)") == 1
    assert dead.logged == 1  # not called again once it failed
    assert dead.finished == 1  # finished (quietly) once, at the failure, not again at close
    assert logger.failed == {"wandb": "ConnectionResetError: Connection lost"}
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r["step"] for r in records] == [0, 1, 2]  # the other sinks go on
    assert FAILED_SINKS_KEY not in records[0]  # step 0 was written before W&B failed
    assert [r[FAILED_SINKS_KEY] for r in records[1:]] == [1.0, 1.0]
    assert len(read_metrics(tmp_path / SAMPLES_FILE)) == 3


def test_every_sink_fails_soft(tmp_path, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MetricsLogger, "_init_tensorboard", broken)  # fails at start
    logger = _logger(tmp_path, console=True, tensorboard=True)
    assert "tensorboard" in logger.failed
    (tmp_path / METRICS_FILE).mkdir()  # appending to it fails
    (tmp_path / SAMPLES_FILE).mkdir()
    monkeypatch.setattr(logger._bar, "update", broken)
    for step in range(2):
        logger.log(step, {"reward/mean": 0.5, "actor/pg_loss": 0.1})
        logger.log_samples(step, [{"step": step, "response": "r"}])
    logger.message("still heard")  # the console sink is off: plain stderr
    logger.close()
    assert set(logger.failed) == {"tensorboard", "jsonl", "samples", "console"}
    err = capsys.readouterr().err
    for sink in logger.failed:
        assert err.count(f"warning: the {sink} metrics sink failed") == 1
    assert "still heard" in err


def test_wandb_mode_comes_from_the_config_before_wandb_starts(tmp_path, monkeypatch):
    """The W&B service reads WANDB_MODE from the environment when it starts; without it an offline
    run still looks up W&B's host. The config's mode is set there first, then given back."""
    seen = []

    def init(**kwargs):
        seen.append((os.environ.get("WANDB_MODE"), kwargs["mode"], kwargs["id"]))
        return types.SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = _logger(tmp_path, wandb=WandbConfig(enabled=True, mode="offline"))
    run_id = (tmp_path / "wandb_run_id.txt").read_text()
    assert seen == [("offline", "offline", run_id)]
    logger.close()
    assert "WANDB_MODE" not in os.environ
    monkeypatch.setenv("WANDB_MODE", "online")  # a resumed run: the config wins, the same run id
    _logger(tmp_path, start_step=3, wandb=WandbConfig(enabled=True, mode="offline")).close()
    assert seen[1] == ("offline", "offline", run_id) and os.environ["WANDB_MODE"] == "online"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to watch the network calls")
def test_offline_wandb_touches_no_network(tmp_path):
    pytest.importorskip("wandb")
    script = textwrap.dedent(
        f"""
        from nemo_azr.config.schema import LoggerConfig, WandbConfig
        from nemo_azr.trainer.metrics import MetricsLogger
        cfg = LoggerConfig(console=False, wandb=WandbConfig(enabled=True, mode="offline"))
        logger = MetricsLogger(cfg, {str(tmp_path)!r}, run_config={{}}, total_steps=1, start_step=0, run_name="t")
        logger.log(0, {{"reward/mean": 1.0}})
        logger.close()
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    trace = tmp_path / "trace.txt"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=connect", "-o", str(trace), sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    if proc.returncode != 0 and not trace.exists():
        pytest.skip(f"strace cannot trace here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any((tmp_path / "wandb").glob("offline-run-*"))  # W&B really ran
    network = [line for line in trace.read_text().splitlines() if "AF_INET" in line]
    assert network == []  # not even a DNS lookup


def _jsonl(path, steps, *, torn=False):
    lines = [json.dumps({"step": s, "reward/mean": s / 10}) for s in steps]
    path.write_text("".join(x + "\n" for x in lines) + ('{"step": 9, "rew' if torn else ""))


def test_truncate_keeps_earlier_steps_drops_later_and_torn_lines(tmp_path):
    path = tmp_path / METRICS_FILE
    _jsonl(path, range(1, 7), torn=True)
    truncate_jsonl(path, 4)  # resuming from step_4: steps 1-4 stay
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]
    mtime = path.stat().st_mtime_ns
    truncate_jsonl(path, 4)  # nothing to drop: not rewritten
    assert path.stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [METRICS_FILE]  # no temp left


_CRASH = """
import os, sys
from pathlib import Path
from nemo_azr.utils import atomic_io
from nemo_azr.trainer.metrics import truncate_jsonl
from nemo_azr.utils.atomic_io import atomic_write_text
point, target, call = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
real = getattr(os, point)
def crash(*args):  # the process dies here, as under kill -9 or a power cut
    os._exit(9)
setattr(os, point, crash)
truncate_jsonl(target, 2) if call == "truncate" else atomic_write_text(target, "new-id")
"""


@pytest.mark.parametrize("point", ["fsync", "replace"])
def test_a_crash_mid_rewrite_leaves_the_old_file(tmp_path, point):
    """Killed after the new content is written (fsync) or just before the swap (replace): the old
    metrics.jsonl / run-id file is intact, and the next rewrite succeeds and leaves no temp."""
    metrics = tmp_path / METRICS_FILE
    _jsonl(metrics, range(1, 6))
    run_id = tmp_path / "wandb_run_id.txt"
    run_id.write_text("old-id")
    before = metrics.read_bytes()
    for target, call in ((metrics, "truncate"), (run_id, "write")):
        crashed = subprocess.run([sys.executable, "-c", _CRASH, point, str(target), call], timeout=120)
        assert crashed.returncode == 9  # it died mid-rewrite
    assert metrics.read_bytes() == before
    assert run_id.read_text() == "old-id"

    truncate_jsonl(metrics, 2)
    atomic_write_text(run_id, "new-id")
    assert [r["step"] for r in read_metrics(metrics)] == [1, 2]
    assert run_id.read_text() == "new-id"
    assert sorted(p.name for p in tmp_path.iterdir()) == [METRICS_FILE, "wandb_run_id.txt"]


def test_a_step_that_runs_long_prints_still_running_until_it_is_logged(tmp_path, capsys):
    import time

    logger = _logger(tmp_path, console=True, heartbeat_s=0.05)
    try:
        logger.step_started(7)
        seen = ""
        deadline = time.monotonic() + 30  # a loaded machine: wait for the lines, never for a time
        while seen.count("step 7: still running") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            seen += capsys.readouterr().err
        assert seen.count("step 7: still running (0m 0") >= 2, seen  # again and again, not once
        logger.log(7, {"reward/mean": 1.0})
        capsys.readouterr()
        time.sleep(0.3)  # six heartbeat periods: a cancelled beat must stay silent
        assert "still running" not in capsys.readouterr().err
    finally:
        logger.close()


def test_no_heartbeat_when_it_is_off(tmp_path, capsys):
    import time

    logger = _logger(tmp_path, console=True, heartbeat_s=0)
    logger.step_started(0)
    time.sleep(0.2)
    logger.close()
    assert "still running" not in capsys.readouterr().err
