"""A rank tells the batch script it acts on signals (``rank-<RANK>`` in ``NEMO_AZR_READY_DIR``), and
``nemo-azr train`` does so before its heavy imports."""

from __future__ import annotations

import subprocess
import sys

from nemo_azr.trainer.preemption import READY_DIR_ENV, report_ready


def test_report_ready_marks_this_rank(tmp_path, monkeypatch):
    monkeypatch.setenv(READY_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    report_ready()
    monkeypatch.delenv("RANK")
    monkeypatch.setenv("SLURM_PROCID", "5")  # srun's one-task job sets no RANK
    report_ready()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-3", "rank-5"]


def test_report_ready_without_the_batch_script_does_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(READY_DIR_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    report_ready()
    assert list(tmp_path.iterdir()) == []


def test_train_reports_ready_before_importing_torch(tmp_path):
    """The marker appears while the command is still in its first imports: torch is not loaded yet
    when ``report_ready`` runs (checked from inside the process)."""
    probe = (
        "import sys, nemo_azr.trainer.preemption as p\n"
        "real = p.report_ready\n"
        "def spy():\n"
        "    real()\n"
        "    print('torch loaded:', 'torch' in sys.modules, flush=True)\n"
        "    raise SystemExit(0)\n"
        "p.report_ready = spy\n"
        "from nemo_azr.cli import main\n"
        "main(['train'])\n"
    )
    env = {"PATH": "/usr/bin:/bin", READY_DIR_ENV: str(tmp_path), "RANK": "0"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "torch loaded: False", out.stderr[-2000:]
    assert (tmp_path / "rank-0").is_file()
