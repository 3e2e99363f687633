"""One optimizer step of a preference loss (DPO, IPO over pairs; KTO over labelled rows) for a policy.

The batch follows the preference contract (``nemo_azr/contracts/preference.py``) and carries the
frozen reference's token log-probs (``ref_logprobs``, computed once per batch by the caller). Pairs
are cut into micro-batches of ``micro_batch_rows() // 2`` pairs, the chosen and the rejected row of a
pair always in the same one (the loss compares them); each micro-batch's mean loss is weighted by its
share of the pairs, so the accumulated gradient is the gradient of the mean over all pairs whatever
the micro-batch size. Then one clipped optimizer step.

KTO's reference point ``z0`` is a batch statistic (the mean log-ratio over the mismatched rows, not
differentiated), so it is computed first over all of them, and every micro-batch of labelled rows
is scored against that one value: the step equals the loss over the whole batch at once.
"""

from __future__ import annotations

import torch

from nemo_azr.algorithms.preference import PAIRED_LOSSES, chosen_nll, sequence_logps
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.preference import kto_rows, pair_rows, validate_preference_batch
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.models.training.microbatch import trim_padding
from nemo_azr.registry import PREFERENCE_LOSSES

__all__ = ["PAIRED_LOSSES", "PreferenceUpdateMixin", "check_nll_weight", "check_preference_step"]


def check_preference_step(batch: Batch, loss: str) -> str:
    """``loss`` if it names a preference loss the step trains and ``batch`` is fit for it (the
    contract, plus the reference log-probs the caller computes); else a clear error. Every backend's
    ``preference_step`` starts here."""
    if loss not in (*PAIRED_LOSSES, "kto"):
        raise ConfigError(
            f"preference loss {loss!r}: the preference step trains {', '.join(PAIRED_LOSSES)} "
            "(a pair's two rows per loss term) and kto (labelled rows)"
        )
    validate_preference_batch(batch, paired=loss != "kto", kl_rows=loss == "kto")
    if F.REF_LOGPROBS not in batch.tensors:
        raise BatchContractError(
            f"preference batch: missing key {F.REF_LOGPROBS!r} [B,T] float (the frozen reference's "
            "token log-probs, computed once per batch)"
        )
    return loss


def check_nll_weight(loss: str, nll_weight: float) -> None:
    """RPO's NLL term is defined for pairs (the chosen reply) and is a non-negative weight."""
    if nll_weight < 0 or (nll_weight and loss not in PAIRED_LOSSES):
        raise ConfigError(
            f"preference nll_weight={nll_weight}: the chosen reply's NLL term (RPO) needs a weight >= 0 "
            f"and a paired loss ({', '.join(PAIRED_LOSSES)}); preference.loss={loss}"
        )


class PreferenceUpdateMixin:
    """``preference_step`` for a policy with differentiable ``token_logprobs``, ``micro_batch_rows``
    and ``_clip_and_step`` (the hf policy)."""

    def preference_step(
        self,
        batch: Batch,
        *,
        loss: str,
        beta: float,
        label_smoothing: float = 0.0,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        nll_weight: float = 0.0,
    ) -> dict[str, float]:
        """One step of ``loss`` over every pair (DPO, IPO; plus ``nll_weight`` x the chosen replies'
        per-token NLL, RPO) or labelled row (KTO, weighted by ``desirable_weight`` /
        ``undesirable_weight``) of ``batch``; returns ``preference/*`` metrics."""
        loss_fn = PREFERENCE_LOSSES.get(check_preference_step(batch, loss))
        check_nll_weight(loss, nll_weight)
        ref = sequence_logps(batch[F.REF_LOGPROBS].float(), batch[F.LOSS_MASK]).to(self.device)
        if loss == "kto":
            return self._kto_step(batch, ref, loss_fn, beta, desirable_weight, undesirable_weight)
        chosen, rejected = pair_rows(batch)
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
            if nll_weight:
                nll = chosen_nll(seq[:k], part[F.LOSS_MASK][:k].sum(-1).to(seq.device))
                value = value + nll_weight * nll
                metrics = {**metrics, "chosen_nll": nll.detach()}
            share = k / pairs
            (value * share).backward()
            totals["loss"] += float(value.detach()) * share
            for name, v in metrics.items():
                totals[name] = totals.get(name, 0.0) + float(v) * share
        grad_norm = self._clip_and_step()
        out = {f"preference/{name}": v for name, v in totals.items()}
        out.update({"preference/grad_norm": grad_norm, "preference/pairs": float(pairs)})
        return out

    def _sequence_logps(self, batch: Batch, rows: torch.Tensor) -> torch.Tensor:
        part, _ = trim_padding(batch.index(rows))
        return sequence_logps(self.token_logprobs(part), part[F.LOSS_MASK].to(self.device))

    def _kto_step(
        self,
        batch: Batch,
        ref: torch.Tensor,
        loss_fn,
        beta: float,
        desirable_weight: float,
        undesirable_weight: float,
    ) -> dict[str, float]:
        examples, mismatched = kto_rows(batch)
        per_micro = max(1, self.micro_batch_rows())
        with torch.no_grad():  # z0 is not differentiated (the paper's reference point)
            kl_logps = torch.cat(
                [
                    self._sequence_logps(batch, mismatched[s : s + per_micro])
                    for s in range(0, len(mismatched), per_micro)
                ]
            )
        ref_kl = ref[mismatched]
        desirable = batch[F.PREFERENCE_LABEL][examples].bool().to(self.device)
        weights = {"desirable_weight": desirable_weight, "undesirable_weight": undesirable_weight}
        n, seqs = len(examples), []
        for start in range(0, n, per_micro):
            rows = examples[start : start + per_micro]
            seq = self._sequence_logps(batch, rows)
            part = slice(start, start + len(rows))
            value, _ = loss_fn(seq, ref[rows], desirable[part], kl_logps, ref_kl, beta=beta, **weights)
            (value * (len(rows) / n)).backward()
            seqs.append(seq.detach())
        grad_norm = self._clip_and_step()
        # metrics over the whole batch at once (a micro-batch may hold one label only)
        value, metrics = loss_fn(
            torch.cat(seqs), ref[examples], desirable, kl_logps, ref_kl, beta=beta, **weights
        )
        out = {"preference/loss": float(value)}
        out.update({f"preference/{name}": float(v) for name, v in metrics.items()})
        out.update({"preference/grad_norm": grad_norm, "preference/examples": float(n)})
        return out
