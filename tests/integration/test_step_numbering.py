"""One step numbering (decision 157): the console's "step N", metrics.jsonl's and samples.jsonl's
``step``, checkpoint ``step_N`` with its trainer_state.json, and "completed at step N" name the same
step, counted from 1, and a resume goes on with the next number."""

from __future__ import annotations

import json
import re

from nemo_azr.cli import main
from nemo_azr.trainer.metrics import read_metrics


def _args(tiny_cache, out, steps: int) -> list[str]:
    return [
        "train",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={out}",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        f"trainer.max_steps={steps}",
        "trainer.save_interval=2",
        "trainer.keep_last=0",
        "logger.console=true",
        "logger.console_interval=1",
        "logger.console_samples=true",
        "logger.heartbeat_s=0",
        "logger.wandb.enabled=false",
    ]


def test_console_metrics_samples_and_checkpoints_count_steps_alike(tiny_cache, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_args(tiny_cache, out, 3)) == 0
    captured = capsys.readouterr()
    assert "completed at step 3" in captured.out
    console_steps = [int(n) for n in re.findall(r"^step (\d+): reward", captured.err, flags=re.M)]
    sample_steps = [int(n) for n in re.findall(r"^step (\d+) samples:", captured.err, flags=re.M)]
    assert console_steps == sample_steps == [1, 2, 3]

    metrics = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [1, 2, 3]
    # step_2 is written after step 2's record: its time is in the next record's timing/save_s
    assert [r["timing/save_s"] > 0 for r in metrics] == [False, False, True]
    assert sorted({r["step"] for r in read_metrics(out / "samples.jsonl")}) == [1, 2, 3]
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts == ["step_2", "step_3"]
    for name in ckpts:
        state = json.loads((out / "checkpoints" / name / "trainer_state.json").read_text())
        assert state["step"] == int(name.removeprefix("step_"))
    # the console line of step 3 and metrics row 3 are the same step's numbers
    reward_3 = re.search(r"^step 3: reward/mean=(\S+)", captured.err, flags=re.M).group(1)
    assert float(reward_3) == float(f"{metrics[2]['reward/mean']:.4g}")

    assert main(_args(tiny_cache, out, 4)) == 0  # resumed from step_3: the next step is 4
    captured = capsys.readouterr()
    assert f"resumed from {out}/checkpoints/step_3 (step 3)" in captured.err
    assert re.findall(r"^step (\d+): reward", captured.err, flags=re.M) == ["4"]
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert "completed at step 4" in captured.out
