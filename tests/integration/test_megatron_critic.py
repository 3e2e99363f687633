"""The ``megatron`` critic trains like the ``hf`` critic: PPO steps (critic and policy) at TP=1, TP=2,
TP=2 with sequence parallelism, PP=2 and DP=2 with the distributed optimizer give the hf run's
metrics, and a TP=2 checkpoint of the critic loads at PP=2 with the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.trainer.sft import run_sft_warmup  # noqa: E402
from nemo_azr.trainer.trainer import Trainer  # noqa: E402
from tests.integration.torchrun import run_torchrun_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_critic_worker.py")
STEPS = 3
ATOL = 1e-5
#: The metrics each backend must reproduce, step by step.
KEYS = (
    "critic/vf_loss",
    "critic/grad_norm",
    "critic/values_mean",
    "critic/returns_mean",
    "actor/loss",
    "actor/grad_norm",
)
VARIANTS = {
    "tp2": ["parallel=tp2pp1"],
    "tp2_sp": ["parallel=tp2pp1", "parallel.sequence_parallel=true"],
    "pp2": ["parallel=tp1pp2"],
    "dp2_distopt": ["parallel=dp2", "parallel.distributed_optimizer=true"],
}


def _overrides(cache: str, warm: str) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        "logger=quiet",
        "trainer.device=cpu",
        "sft_warmup.steps=0",
        "data.prompts_per_step=2",
        "generation.n_samples=4",
        "algorithm=ppo",
        "critic.optim.lr=0.01",  # large: the values move visibly in three steps
        # Adam's eps above float noise (as in test_megatron_train.py): near-zero gradients must not
        # turn the backends' reduction-order differences into 1e-5 weight differences.
        "optim.eps=1e-4",
        "critic.optim.eps=1e-4",
        f"model.path={warm}",
    ]


def _fixed_batch(vocab: int) -> dict[str, torch.Tensor]:
    from nemo_azr.contracts.assemble import pack_prompt_response

    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 2, 7, 3)]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (4, 6, 1, 5)]
    return pack_prompt_response(prompts, responses, None, pad_id=0)


@pytest.fixture(scope="module")
def warm(tiny_cache, tmp_path_factory) -> str:
    """The tiny model after a short supervised warm-up, so rewards differ and advantages are real."""
    out = tmp_path_factory.mktemp("critic_warm")
    cfg = load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={out}",
            "sft_warmup.steps=40",
        ]
    )
    trainer = Trainer(cfg)
    run_sft_warmup(trainer.policy, trainer.task, trainer.tokenizer, cfg, workflow=trainer.workflow)
    trainer.policy.save(out, tokenizer=trainer.tokenizer)
    return str(out / "model")


def _run(cfg, batch: dict) -> tuple[list[dict], torch.Tensor]:
    trainer = Trainer(cfg)
    trainer.setup_generation()
    metrics = [trainer.train_step(step) for step in range(STEPS)]
    return metrics, trainer.critic.compute_values(Batch(dict(batch)))


@pytest.fixture(scope="module")
def reference(warm, tiny_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("critic_hf")
    vocab = json.loads((Path(warm) / "config.json").read_text())["vocab_size"]
    batch = _fixed_batch(vocab)
    torch.save(batch, out / "batch.pt")
    cfg = load_config([*_overrides(tiny_cache, warm), "model.backend=hf", f"trainer.output_dir={out}"])
    metrics, values = _run(cfg, batch)
    assert any(m["critic/grad_norm"] > 0 for m in metrics) and values.abs().sum() > 0  # the critic moved
    return out, metrics, values


def _assert_same_run(metrics: list[dict], ref: list[dict]) -> None:
    assert len(metrics) == len(ref) == STEPS
    for step, (got, want) in enumerate(zip(metrics, ref)):
        assert got["reward/mean"] == want["reward/mean"], step
        for key in KEYS:
            assert got[key] == pytest.approx(want[key], abs=ATOL, rel=1e-4), (step, key)


def test_single_process_megatron_critic_matches_hf(reference, warm, tiny_cache, tmp_path):
    _, ref_metrics, ref_values = reference
    batch = torch.load(reference[0] / "batch.pt")
    cfg = load_config(
        [*_overrides(tiny_cache, warm), "model.backend=megatron", f"trainer.output_dir={tmp_path}"]
    )
    metrics, values = _run(cfg, batch)
    _assert_same_run(metrics, ref_metrics)
    torch.testing.assert_close(values, ref_values, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def two_process_run(reference, warm, tiny_cache, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("critic_mp")
    spec = {
        "overrides": _overrides(tiny_cache, warm),
        "variants": VARIANTS,
        "reshard": ["parallel=tp1pp2"],
        "steps": STEPS,
        "batch_file": str(reference[0] / "batch.pt"),
    }
    run_torchrun_worker(WORKER, out, spec, timeout=600)
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parallel_critic_steps_match_hf(name, two_process_run, reference):
    _, ref_metrics, ref_values = reference
    _assert_same_run(json.loads((two_process_run / f"steps_{name}.json").read_text()), ref_metrics)
    torch.testing.assert_close(
        torch.load(two_process_run / f"values_{name}.pt"), ref_values, atol=ATOL, rtol=0
    )


def test_critic_checkpoint_reshards(two_process_run, reference):
    """Written at TP=2 (the value head replicated over the TP ranks), loaded at PP=2 (the head on the
    last stage): the same values."""
    _, _, ref_values = reference
    resharded = torch.load(two_process_run / "values_resharded.pt")
    torch.testing.assert_close(resharded, torch.load(two_process_run / "values_tp2.pt"), atol=1e-6, rtol=0)
    torch.testing.assert_close(resharded, ref_values, atol=ATOL, rtol=0)
