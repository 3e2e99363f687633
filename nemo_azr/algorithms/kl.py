"""Per-token KL estimators between the policy and a reference (Schulman's k1 / k2 / k3).

With ``d = logprobs - ref_logprobs`` for tokens sampled from the policy:

* ``k1 = d`` (unbiased, can be negative);
* ``k2 = d^2 / 2`` (biased, low variance);
* ``k3 = exp(-d) + d - 1`` (unbiased, always >= 0, low variance).
"""

from __future__ import annotations

import torch

from nemo_azr.errors import ConfigError

KL_ESTIMATORS = ("k1", "k2", "k3")
#: Where the KL term goes: added to the policy loss, or subtracted from the token rewards.
KL_MODES = ("loss", "reward")
#: Bound on ``ref - logp`` before ``exp`` in k3: exp(20) ~ 4.9e8 stays finite in float32 / bfloat16;
#: a token that far off is an outlier whose exact value does not matter, but an inf would poison the batch.
KL_LOG_RATIO_CLAMP = 20.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate ``kl[B, T]`` from ``logprobs[B, T]`` and ``ref_logprobs[B, T]``."""
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k2":
        return 0.5 * (logprobs - ref_logprobs).square()
    if estimator == "k3":
        log_ratio = (ref_logprobs - logprobs).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ConfigError(f"unknown KL estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")


def check_kl_mode(mode: str) -> None:
    """Raise :class:`ConfigError` unless ``mode`` is one of :data:`KL_MODES`."""
    if mode not in KL_MODES:
        raise ConfigError(f"unknown algorithm.kl.mode {mode!r}; known: {', '.join(KL_MODES)}")
