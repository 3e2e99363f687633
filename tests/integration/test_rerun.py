"""Re-running a finished job says there is nothing to train and how to go on, in one line."""

from __future__ import annotations

from nemo_azr.cli import main


def test_rerun_of_a_finished_job_says_so(tiny_cache, tmp_path, capsys):
    args = [
        "train",
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={tmp_path}",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "trainer.max_steps=1",
    ]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "completed at step 1; reward/mean=" in first
    assert main(args) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines == [
        f"nothing to train: {tmp_path}/checkpoints/step_1 already reached trainer.max_steps=1. "
        "Raise trainer.max_steps to train on, or start over with trainer.resume=never "
        f"(overwrites {tmp_path}) or another trainer.output_dir"
    ]
    assert main([*args, "trainer.max_steps=2"]) == 0  # and raising max_steps trains on
    assert "completed at step 2" in capsys.readouterr().out
