"""Advantages computed per role: each role's rows go through its own registered estimator.

Self-play batches mix solver rows (normalised per question) and proposer rows (normalised across
the batch's proposers, possibly by another estimator). Splitting by the explicit ``role`` meta and
scattering the results back keeps every estimator unaware of the other role.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from nemo_azr.algorithms.advantages import EstimatorFn
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.batch import Batch
from nemo_azr.contracts.schema import STEP_ROLE_ADVANTAGE_SCALES
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.registry import ADVANTAGE_ESTIMATORS


def role_split_estimator(
    estimators: Mapping[str, str], scales: Mapping[str, float] | None = None
) -> EstimatorFn:
    """An estimator ``fn(batch, cfg)`` that applies ``estimators[role]`` to each role's rows.

    ``scales[role]`` (default 1.0) multiplies that role's advantages after its estimator ran: with
    one shared model and one learning rate it sets how fast each role's policy moves (the returns a
    critic learns from are left as they are). A batch may carry a step's own factors on top
    (``batch.info[STEP_ROLE_ADVANTAGE_SCALES]``, e.g. the solver gate's 0 on a held-back step)."""
    fns = {role: ADVANTAGE_ESTIMATORS.get(name) for role, name in estimators.items()}
    scales = dict(scales or {})
    unknown_scaled = sorted(set(scales) - set(fns))
    if unknown_scaled:
        raise ConfigError(
            f"advantage scales for role(s) {unknown_scaled} with no estimator; roles: {sorted(fns)}"
        )
    for role, fn in fns.items():
        if getattr(fn, "needs_greedy_baseline", False):
            raise ConfigError(
                f"estimator {estimators[role]!r} (role {role}) needs a greedy baseline rollout, which "
                "per-role advantages do not run; choose grpo, rloo or reinforce_plus_plus"
            )

    def per_role(batch: Batch, cfg: AlgorithmConfig) -> tuple[torch.Tensor, torch.Tensor | None]:
        if F.ROLE not in batch.meta:
            raise BatchContractError("per-role advantages need the per-row meta 'role'")
        roles = batch.meta[F.ROLE]
        unknown = sorted(set(roles) - set(fns))
        if unknown:
            raise BatchContractError(
                f"rows with role(s) {unknown} have no estimator; known roles: {sorted(fns)}"
            )
        advantages = torch.zeros(batch[F.LOSS_MASK].shape, dtype=torch.float32)
        returns = None
        step_scales = batch.info.get(STEP_ROLE_ADVANTAGE_SCALES, {})
        for role, fn in fns.items():
            rows = [i for i, r in enumerate(roles) if r == role]
            if not rows:
                continue
            adv, ret = fn(batch.index(rows), cfg)
            index = torch.as_tensor(rows, dtype=torch.long)
            scale = float(scales.get(role, 1.0)) * float(step_scales.get(role, 1.0))
            advantages[index] = adv.to(advantages.dtype) * scale
            if ret is not None:
                returns = torch.zeros_like(advantages) if returns is None else returns
                returns[index] = ret.to(returns.dtype)
        return advantages, returns

    per_role.required_keys = tuple(sorted({k for fn in fns.values() for k in fn.required_keys}))  # type: ignore[attr-defined]
    per_role.required_meta = (F.ROLE, *sorted({k for fn in fns.values() for k in fn.required_meta}))  # type: ignore[attr-defined]
    per_role.needs_greedy_baseline = False  # type: ignore[attr-defined]
    per_role.min_samples_per_prompt = max(fn.min_samples_per_prompt for fn in fns.values())  # type: ignore[attr-defined]
    return per_role
