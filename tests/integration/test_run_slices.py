"""``trainer.max_steps_per_run``: a run trains a slice, checkpoints and exits 75; the next run continues,
and the slices together log exactly what one uninterrupted run logs (what a SLURM --chain relies on)."""

from __future__ import annotations

import pytest

from nemo_azr.cli import main as nemo_azr_main
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.preemption import EXIT_PREEMPTED

STEPS = 3


def _overrides(tiny_cache, out, *extra):
    return [
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={STEPS}",
        "sft_warmup.steps=20",  # some rewards > 0, so the steps really update
        "data.prompts_per_step=4",
        "generation.n_samples=4",
        "algorithm.mini_batch_size=8",  # two optimizer steps per RL step: Adam state must carry over
        *extra,
    ]


def _comparable(records):
    return without_machine_metrics(records)


@pytest.mark.slow
def test_slices_reproduce_an_uninterrupted_run(tiny_cache, tmp_path, capsys):
    full = tmp_path / "full"
    assert nemo_azr_main(["train", *_overrides(tiny_cache, full)]) == 0

    sliced = tmp_path / "sliced"
    args = ["train", *_overrides(tiny_cache, sliced, "trainer.max_steps_per_run=2")]
    capsys.readouterr()
    assert nemo_azr_main(args) == EXIT_PREEMPTED  # steps 0-1, then "paused"
    assert "paused at step 2" in capsys.readouterr().out
    assert (sliced / "checkpoints" / "step_2" / "COMPLETE").is_file()
    assert nemo_azr_main(args) == 0  # step 2: the last slice is shorter and completes
    assert "completed at step 3" in capsys.readouterr().out
    # A spare run (e.g. one chain link too many) trains nothing and keeps the final checkpoint.
    done = sliced / "checkpoints" / "step_3" / "COMPLETE"
    mtime = done.stat().st_mtime_ns
    assert nemo_azr_main(args) == 0
    assert done.stat().st_mtime_ns == mtime

    a = _comparable(read_metrics(full / "metrics.jsonl"))
    b = _comparable(read_metrics(sliced / "metrics.jsonl"))
    assert [r["step"] for r in b] == list(range(1, STEPS + 1))
    assert a == b
    assert any(r["actor/grad_norm"] > 0 for r in a)  # real updates, so a lost optimizer state would show
