"""One optimizer step of a paired preference loss (DPO, IPO) for a policy backend.

The batch follows the preference contract (``nemo_azr/contracts/preference.py``) and carries the
frozen reference's token log-probs (``ref_logprobs``, computed once per batch by the caller). Pairs
are cut into micro-batches of ``micro_batch_rows() // 2`` pairs, the chosen and the rejected row of a
pair always in the same one (the loss compares them); each micro-batch's mean loss is weighted by its
share of the pairs, so the accumulated gradient is the gradient of the mean over all pairs whatever
the micro-batch size. Then one clipped optimizer step.
"""

from __future__ import annotations

import torch

from nemo_azr.algorithms.preference import PAIRED_LOSSES, sequence_logps
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.preference import pair_rows, validate_preference_batch
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.models.training.microbatch import trim_padding
from nemo_azr.registry import PREFERENCE_LOSSES

__all__ = ["PAIRED_LOSSES", "PreferenceUpdateMixin"]


class PreferenceUpdateMixin:
    """``preference_step`` for a policy with differentiable ``token_logprobs``, ``micro_batch_rows``
    and ``_clip_and_step`` (the hf policy)."""

    def preference_step(
        self, batch: Batch, *, loss: str, beta: float, label_smoothing: float = 0.0
    ) -> dict[str, float]:
        """One step of ``loss`` over every pair of ``batch``; returns ``preference/*`` metrics."""
        if loss not in PAIRED_LOSSES:
            raise ConfigError(
                f"preference loss {loss!r}: the preference step trains {', '.join(PAIRED_LOSSES)} "
                "(a pair's two rows per loss term)"
            )
        loss_fn = PREFERENCE_LOSSES.get(loss)
        validate_preference_batch(batch, paired=True)
        if F.REF_LOGPROBS not in batch.tensors:
            raise BatchContractError(
                f"preference batch: missing key {F.REF_LOGPROBS!r} [B,T] float (the frozen reference's "
                "token log-probs, computed once per batch)"
            )
        chosen, rejected = pair_rows(batch)
        ref = sequence_logps(batch[F.REF_LOGPROBS].float(), batch[F.LOSS_MASK]).to(self.device)
        pairs = len(chosen)
        per_micro = max(1, self.micro_batch_rows() // 2)
        totals: dict[str, float] = {"loss": 0.0}
        for start in range(0, pairs, per_micro):
            c, r = chosen[start : start + per_micro], rejected[start : start + per_micro]
            k = len(c)
            part, _ = trim_padding(batch.index(torch.cat([c, r])))
            seq = sequence_logps(self.token_logprobs(part), part[F.LOSS_MASK].to(self.device))
            value, metrics = loss_fn(
                seq[:k], seq[k:], ref[c], ref[r], beta=beta, label_smoothing=label_smoothing
            )
            share = k / pairs
            (value * share).backward()
            totals["loss"] += float(value.detach()) * share
            for name, v in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(v) * share
        grad_norm = self._clip_and_step()
        out = {f"preference/{name}": v for name, v in totals.items()}
        out.update({"preference/grad_norm": grad_norm, "preference/pairs": float(pairs)})
        return out
