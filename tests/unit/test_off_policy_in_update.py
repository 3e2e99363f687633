"""Importance weights computed inside the loss from the update's own log-probs (no old-log-prob
pass) give the update of the explicit path: a no-grad pass for pi_old, advantages weighted first."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from nemo_azr.algorithms.off_policy import rollout_is_weights
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.models.training.ppo_update import add_micro_metrics
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.trainer.trainer import Trainer


def _batch(tok, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    prompts = [encode_prompt(tok, [{"role": "user", "content": q}]) for q in ("1 + 2?", "Hi", "7 + 8?")]
    rows_p = [p for p in prompts for _ in range(4)]
    resp = [
        torch.randint(5, 60, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist()
        for _ in rows_p
    ]
    b = Batch(
        pack_prompt_response(rows_p, resp, None, pad_id=tok.pad_token_id),
        {"uid": list(range(len(rows_p))), "group_id": [i // 4 for i in range(len(rows_p))]},
    )
    b[F.ADVANTAGES] = torch.randn(len(rows_p), 1, generator=g) * b[F.LOSS_MASK]
    return b


def _cfg(fused: bool, mode: str) -> NemoAzrConfig:
    cfg = NemoAzrConfig()
    cfg.model.fused_policy_loss = fused
    cfg.model.logprob_chunk_size = 8  # several chunks per micro-batch in the fused pass
    cfg.algorithm.micro_batch_size = 5  # 12 rows: uneven micro-batches of 5, 5, 2
    cfg.algorithm.shuffle_mini_batches = False
    cfg.algorithm.off_policy_correction = mode
    cfg.algorithm.is_cap = 1.2
    return cfg


def _policy_keeping_grads(path, cfg) -> tuple[HFPolicy, list[list[torch.Tensor]]]:
    """A fresh policy whose optimizer step only records the accumulated gradients."""
    pol = HFPolicy(path, cfg, trainable=True, device="cpu")
    pol.setup_optimizer(total_steps=1)
    captured: list[list[torch.Tensor]] = []
    pol._clip_and_step = lambda: captured.append([p.grad.clone() for p in pol.model.parameters()]) or 1.0
    return pol, captured


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_weights_in_the_loss_equal_weights_from_an_old_logprob_pass(tiny_model_path, fused, mode):
    tok = load_tokenizer(tiny_model_path)
    cfg = _cfg(fused, mode)
    batch = _batch(tok)
    mask = batch[F.LOSS_MASK]

    # Reference: pi_old from a no-grad pass, the advantages weighted before the update.
    pol, captured = _policy_keeping_grads(tiny_model_path, cfg)
    old = pol.compute_logprobs(batch).cpu()
    g = torch.Generator().manual_seed(1)
    rollout = (old + 0.3 * torch.randn(old.shape, generator=g)) * mask  # a stale rollout policy
    weights, ref_metrics = rollout_is_weights(old, rollout, mask, mode=mode, cap=cfg.algorithm.is_cap)
    assert 0 < ref_metrics["off_policy/clipped_frac" if mode == "tis" else "off_policy/masked_frac"] < 1
    ref_batch = batch.index(torch.arange(len(batch)))
    ref_batch[F.OLD_LOGPROBS] = old
    ref_batch[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights
    ref_update = pol.update(ref_batch, UpdateContext(norm_length=8))
    ref_grads = captured[0]

    # In the loss: no old log-probs, the rollout's log-probs in the batch.
    pol, captured = _policy_keeping_grads(tiny_model_path, cfg)
    in_batch = batch.index(torch.arange(len(batch)))
    in_batch[F.ROLLOUT_LOGPROBS] = rollout
    metrics = pol.update(in_batch, UpdateContext(norm_length=8))

    for a, b in zip(captured[0], ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert metrics["actor/loss"] == pytest.approx(ref_update["actor/loss"], rel=1e-4, abs=1e-7)
    # Micro-batch metrics combine to the whole batch's: token-weighted means, maxima.
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_max_metrics_take_the_largest_micro_batch_value():
    acc: dict[str, float] = defaultdict(float)
    add_micro_metrics(
        acc, torch.tensor(0.5), {"off_policy/is_weight_max": 1.5, "actor/clip_frac": 0.2}, weight=0.25
    )
    add_micro_metrics(
        acc, torch.tensor(0.1), {"off_policy/is_weight_max": 1.1, "actor/clip_frac": 0.6}, weight=0.75
    )
    assert acc["off_policy/is_weight_max"] == 1.5
    assert acc["actor/clip_frac"] == pytest.approx(0.2 * 0.25 + 0.6 * 0.75)


@pytest.mark.parametrize(
    ("backend", "level", "ppo_epochs", "expected"),
    [
        ("hf", "token", 1, True),  # weights in the loss: no old-log-prob pass
        ("hf", "sequence", 1, False),  # a row's whole ratio is needed before any token's gradient
        ("megatron", "token", 1, True),  # the megatron loss too
        ("hf", "token", 2, False),  # the second epoch's pi_old is not the update's own
    ],
)
def test_old_logprob_pass_runs_only_where_the_weights_need_it(backend, level, ppo_epochs, expected):
    cfg = NemoAzrConfig()
    cfg.model.backend = backend
    cfg.algorithm.off_policy_correction = "tis"
    cfg.algorithm.is_level = level
    cfg.algorithm.ppo_epochs = ppo_epochs
    trainer = SimpleNamespace(cfg=cfg, ref=None)
    assert Trainer._old_logprobs_from_update(trainer, rows=8) is expected
