"""What one training step reports besides the model's own update metrics: the batch's rewards and
lengths, the stage timings, throughput and memory, and the check that its loss is finite."""

from __future__ import annotations

import math
import resource

import torch

from nemo_azr.algorithms.kl import kl_penalty
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import RewardError
from nemo_azr.trainer.flops import ModelShape, step_flops


def batch_metrics(batch: Batch) -> dict[str, float]:
    """Rewards, response lengths, advantages and sizes of the trained ``batch``."""
    rewards = batch[F.REWARDS].float()
    mask = batch[F.LOSS_MASK].float()
    lengths = mask.sum(-1)
    adv = batch[F.ADVANTAGES][mask > 0]
    finish = batch.meta.get("finish_reason", [])
    return {
        "reward/mean": float(rewards.mean()),
        "reward/std": float(rewards.std(unbiased=False)),
        "reward/max": float(rewards.max()),
        "reward/min": float(rewards.min()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/truncated_frac": (sum(f == "length" for f in finish) / len(finish)) if finish else 0.0,
        "advantage/mean": float(adv.mean()) if adv.numel() else 0.0,
        "advantage/abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
        "batch/rows": float(len(batch)),
        "batch/tokens": float(mask.sum()),
        "batch/prompt_tokens": float(batch[F.ATTENTION_MASK].sum() - mask.sum()),
    }


def role_kl_metrics(batch: Batch, estimator: str) -> dict[str, float]:
    """``kl_to_ref/<role>``: the mean per-token KL estimate (``estimator``, the run's ``algorithm.kl``
    one) from the policy that sampled the rows to the reference, over each role's trained tokens.

    The loss's ``actor/kl_loss`` averages every row, so in a self-play batch it cannot say which role
    moved. The sampling policy's log-probs are the trainer's old ones, or the generation engine's when
    the update makes its own (a single on-policy step). Empty without roles or reference log-probs.
    """
    roles = batch.get(F.ROLE)
    policy = batch.get(F.OLD_LOGPROBS, batch.get(F.ROLLOUT_LOGPROBS))
    if roles is None or policy is None or F.REF_LOGPROBS not in batch:
        return {}
    kl = kl_penalty(policy.float(), batch[F.REF_LOGPROBS].float(), estimator)
    trained = batch[F.LOSS_MASK] > 0
    out = {}
    for role in sorted(set(roles)):
        mask = trained & torch.tensor([r == role for r in roles])[:, None]
        if mask.any():
            out[f"kl_to_ref/{role}"] = float(kl[mask].mean())
    return out


def policy_step_flops(
    shape: ModelShape | None, metrics: dict[str, float], *, logprob_passes: int, update_epochs: int
) -> dict[str, float] | None:
    """The policy's model FLOPs this step (trainer/flops.py) from ``metrics``' batch sizes; None when
    the policy's config has no decoder shape."""
    if shape is None:
        return None
    return step_flops(
        shape,
        rows=int(metrics["batch/rows"]),
        prompt_tokens=metrics["batch/prompt_tokens"],
        response_tokens=metrics["batch/tokens"],
        logprob_passes=logprob_passes,
        update_epochs=update_epochs,
    )


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (Linux ``ru_maxrss`` is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def finite_loss(metrics: dict[str, float]) -> bool:
    loss = metrics.get("actor/loss")
    return loss is None or math.isfinite(loss)


def check_finite_loss(metrics: dict[str, float], step: int) -> None:
    """A NaN/inf policy loss ends the run with one line (the update itself was not applied)."""
    if not finite_loss(metrics):
        raise RewardError(
            f"step {step}: the policy loss is {metrics['actor/loss']}; the update was not applied. "
            "Lower optim.lr or check rewards/advantages"
        )
