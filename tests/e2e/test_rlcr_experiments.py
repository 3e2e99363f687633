"""Both RLCR experiments run 20 steps on CPU; `nemo-azr eval` then writes the diagram and numbers."""

import json
import math

import pytest

from nemo_azr.cli import main
from nemo_azr.trainer.metrics import read_metrics

STEPS = 20


@pytest.mark.e2e
@pytest.mark.parametrize("experiment", ["rlcr_two_turn", "rlcr_single_turn"])
def test_rlcr_experiment_20_steps_then_eval(experiment, tiny_cache, tmp_path, capsys):
    out = tmp_path / experiment
    common = [
        f"experiment={experiment}",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={out}",
        "logger=quiet",
        "sft_warmup.steps=40",
        "data.prompts_per_step=4",
    ]
    assert main(["train", *common, f"trainer.max_steps={STEPS}"]) == 0
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(math.isfinite(r["actor/loss"]) and "rlcr/accuracy" in r for r in records)
    assert main(["eval", *common, "eval.num_examples=16"]) == 0
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["checkpoint"].endswith(f"step_{STEPS}")
    assert all(0.0 <= metrics[k] <= 1.0 for k in ("ece", "brier", "accuracy"))
    assert (out / "eval" / "reliability.png").stat().st_size > 1000
    capsys.readouterr()
