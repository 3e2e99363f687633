"""Every shipped algorithm preset composes and runs real training steps on the tiny model."""

import math

import pytest

from nemo_azr.cli import main
from nemo_azr.config.loader import config_dir
from nemo_azr.preflight import load_config
from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.trainer import Trainer

PRESETS = sorted(p.stem for p in (config_dir() / "algorithm").glob("*.yaml"))


def test_presets_are_found():
    assert {"grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "remax", "gspo", "ppo", "dapo", "cispo"} <= set(
        PRESETS
    )


@pytest.mark.parametrize(
    ("experiment", "preset", "expected"),
    [
        ("arithmetic_grpo_smollm2", "ppo", {"estimator": "gae", "loss": "ppo_clip"}),
        ("arithmetic_grpo_smollm2", "dapo", {"dynamic_sampling": True, "clip_ratio_high": 0.28}),
        ("azr_code", "cispo", {"loss": "cispo", "clip_ratio_low": 1.0}),
        ("rlcr_single_turn_smollm2", "gspo", {"loss": "gspo"}),
    ],
)
def test_presets_compose_with_experiments(experiment, preset, expected):
    """An experiment sets its task and budget, never the algorithm's own keys: `algorithm=X` applies."""
    alg = load_config([f"experiment={experiment}", f"algorithm={preset}"]).algorithm
    assert {k: getattr(alg, k) for k in expected} == expected


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_trains(preset, tiny_cache, tmp_path):
    # DAPO's dynamic sampling skips a step whose groups all have equal rewards: a 3-step warm-up
    # leaves the tiny model at reward 0 everywhere, so DAPO gets a longer warm-up and more rounds.
    dapo = ["sft_warmup.steps=20", "algorithm.max_sampling_rounds=16"] if preset == "dapo" else []
    cfg = load_config(
        [
            f"algorithm={preset}",
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={tmp_path}",
            "trainer.max_steps=2",
            "sft_warmup.steps=3",
            "data.prompts_per_step=2",
            "generation.n_samples=4",
            "algorithm.kl.coef=0.01",
            *dapo,
        ]
    )
    result = Trainer(cfg).fit()
    assert result.status == "completed" and result.step == 2
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert len(records) == 2
    for r in records:
        assert math.isfinite(r["actor/loss"]) and r["actor/optimizer_steps"] == 1.0
        assert r["trainer/policy_version"] == r["step"]


def test_make_tiny_model_command(tiny_cache, capsys):
    assert main(["make-tiny-model", f"model.tiny.cache_dir={tiny_cache}"]) == 0
    folder = capsys.readouterr().out.strip()
    assert folder.startswith(tiny_cache) and "tiny-llama-" in folder
