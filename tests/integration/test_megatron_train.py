"""The ``megatron`` policy backend trains like ``hf``: same loss and weights after a GRPO step on one
process, and TP=2 over gloo (torchrun, 2 processes) runs a few steps with the same step-0 loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.config.loader import load_config  # noqa: E402
from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.trainer.metrics import read_metrics  # noqa: E402
from nemo_azr.trainer.sft import run_sft_warmup  # noqa: E402
from nemo_azr.trainer.trainer import Trainer  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_train_worker.py")
ATOL = 1e-5
TIMEOUT_S = 300
SFT_STEPS = 40


def overrides(cache: str, out: Path, *extra: str) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        "trainer.device=cpu",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "generation.n_samples=4",
        *extra,
    ]


def one_step(cfg) -> tuple[Trainer, dict[str, float]]:
    trainer = Trainer(cfg)
    trainer.setup_generation()
    return trainer, trainer.train_step(0)


def hf_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    policy = trainer.policy
    if hasattr(policy, "export_hf_state_dict"):
        return policy.export_hf_state_dict()
    return {k: v.detach() for k, v in policy.model.state_dict().items()}


@pytest.fixture(scope="module")
def warm_model(tiny_cache, tmp_path_factory) -> str:
    """The tiny model after a short supervised warm-up, so the rollout's rewards differ (a real GRPO
    update). Both backends start from this folder: a warm-up on each would drift apart (AdamW)."""
    out = tmp_path_factory.mktemp("warm")
    cfg = load_config(overrides(tiny_cache, out, "model.backend=hf", f"sft_warmup.steps={SFT_STEPS}"))
    trainer = Trainer(cfg)
    run_sft_warmup(trainer.policy, trainer.task, trainer.tokenizer, cfg, workflow=trainer.workflow)
    trainer.policy.save(out, tokenizer=trainer.tokenizer)
    return str(out / "model")


@pytest.fixture(scope="module")
def hf_step(warm_model, tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf")
    cfg = load_config(overrides(tiny_cache, out, "model.backend=hf", f"model.path={warm_model}"))
    trainer, metrics = one_step(cfg)
    return metrics, hf_weights(trainer)


def test_single_process_matches_hf(hf_step, warm_model, tiny_cache, tmp_path):
    hf_metrics, hf_state = hf_step
    cfg = load_config(
        overrides(
            tiny_cache, tmp_path, "model.backend=megatron", "parallel=tp1pp1", f"model.path={warm_model}"
        )
    )
    trainer, metrics = one_step(cfg)
    assert hf_metrics["actor/grad_norm"] > 0  # a real update (not an all-zero-advantage batch)
    assert metrics["actor/loss"] == pytest.approx(hf_metrics["actor/loss"], abs=ATOL)
    assert metrics["actor/grad_norm"] == pytest.approx(hf_metrics["actor/grad_norm"], rel=1e-4)
    assert metrics["batch/tokens"] == hf_metrics["batch/tokens"]
    state = hf_weights(trainer)
    for key, want in hf_state.items():
        if key not in state:  # a tied lm_head is the embedding
            assert key == "lm_head.weight"
            continue
        torch.testing.assert_close(state[key], want, atol=ATOL, rtol=0, msg=key)
    # The checkpoint round trip restores the HF folder and this rank's optimizer state.
    folder = trainer.save_checkpoint()
    assert (folder / "model" / "model.safetensors").is_file() and (folder / "optim_rank0.pt").is_file()
    trainer.load_checkpoint(folder)
    for key, value in trainer.policy.export_hf_state_dict().items():
        assert torch.equal(value, state[key]), key


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["parallel=tp1pp2"], "pipeline-parallel training is not implemented yet; use parallel=tp2pp1"),
        (["algorithm.entropy_coef=0.01"], "entropy_coef > 0 is not supported by model.backend=megatron"),
    ],
)
def test_unsupported_layouts_are_rejected(extra, message, tiny_cache, tmp_path):
    cfg = load_config(overrides(tiny_cache, tmp_path, "model.backend=megatron", *extra))
    with pytest.raises(ConfigError, match=message):
        Trainer(cfg)


def test_tp2_over_gloo_trains(hf_step, warm_model, tiny_cache, tmp_path):
    out = tmp_path / "run"
    args = overrides(
        tiny_cache,
        out,
        "parallel=tp2pp1",
        f"model.path={warm_model}",
        "trainer.max_steps=6",
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(
        [*cmd, str(WORKER), str(tmp_path), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result == {"status": "completed", "step": 6, "world": 2}
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(6))  # rank 0 alone wrote each step once
    assert records[0]["actor/loss"] == pytest.approx(hf_step[0]["actor/loss"], abs=ATOL)
    assert all(torch.isfinite(torch.tensor(r["actor/loss"])) for r in records)
    ckpt = out / "checkpoints" / "step_6"
    assert (ckpt / "optim_rank0.pt").is_file() and (ckpt / "optim_rank1.pt").is_file()
