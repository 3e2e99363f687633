"""The paired preference step (DPO, IPO) for the megatron policy, under any TP / PP / DP layout.

The pair losses compare a pair's two rows, so both must be in one micro-batch on one data-parallel
rank. The megatron update splits a batch by strided rows over the data-parallel ranks and cuts each
rank's rows into consecutive micro-batches of ``parallel.micro_batch_size`` rows (pipelined or not);
so the batch is first arranged such that rank r's strided rows are its pairs, each chosen row
followed by its rejected one, and the micro-batch size must be even. Each micro-batch's mean loss is
weighted by its share of all pairs, so the gradient summed over micro-batches and ranks is the
gradient of the mean over the batch's pairs, as the hf step computes it.
"""

from __future__ import annotations

from typing import Any

import torch

from nemo_azr.algorithms.preference import chosen_nll, sequence_logps
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.preference import kto_rows, pair_rows
from nemo_azr.errors import ConfigError
from nemo_azr.models.training.preference_update import check_nll_weight, check_preference_step
from nemo_azr.registry import PREFERENCE_LOSSES

__all__ = ["MegatronPreferenceMixin", "pair_major_order"]

#: Per-row reference sequence log-prob carried through the megatron micro-batches.
REF_SEQ_KEY = "preference_ref_seq_logps"


def pair_major_order(chosen: torch.Tensor, rejected: torch.Tensor, dp: int) -> torch.Tensor:
    """Row order whose strided split over ``dp`` ranks gives rank r the pairs r, r + dp, ...,
    each as (chosen, rejected) consecutively: row ``i * dp + r`` of the result is rank r's i-th row."""
    pairs = len(chosen)
    if pairs % dp:
        raise ConfigError(
            f"megatron preference step: {pairs} pairs do not split evenly over {dp} data-parallel ranks; "
            "make data.prompts_per_step a multiple of the data-parallel size"
        )
    per_rank = [
        [int(row) for p in range(r, pairs, dp) for row in (chosen[p], rejected[p])] for r in range(dp)
    ]
    return torch.tensor([per_rank[r][i] for i in range(len(per_rank[0])) for r in range(dp)])


class MegatronPreferenceMixin:
    """``preference_step`` for :class:`~nemo_azr.models.megatron.policy.MegatronPolicy` (mixed in):
    uses its ``backward_rows``, ``_dp``, ``micro_batch_rows`` and ``_clip_and_step``."""

    cfg: Any
    optimizer: Any

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
        """One optimizer step of DPO / IPO (plus ``nll_weight`` x the chosen replies' per-token NLL,
        RPO) over every pair of ``batch``, or of KTO over its labelled rows; ``preference/*`` metrics."""
        loss_fn = PREFERENCE_LOSSES.get(check_preference_step(batch, loss))
        check_nll_weight(loss, nll_weight)
        if loss == "kto":
            return self._kto_step(batch, loss_fn, beta, desirable_weight, undesirable_weight)
        if self.micro_batch_rows() % 2:
            raise ConfigError(
                f"megatron preference step: parallel.micro_batch_size={self.micro_batch_rows()} must be even "
                "(a pair's two rows go into one micro-batch)"
            )
        if self.cfg.algorithm.max_tokens_per_microbatch > 0:
            raise ConfigError(
                "megatron preference step: algorithm.max_tokens_per_microbatch must be 0 (token-budget "
                "micro-batches would split pairs)"
            )
        chosen, rejected = pair_rows(batch)
        pairs = len(chosen)
        arranged = batch.index(pair_major_order(chosen, rejected, self._dp()[1]))
        arranged[REF_SEQ_KEY] = sequence_logps(arranged[F.REF_LOGPROBS].float(), arranged[F.LOSS_MASK])

        def micro_loss(
            micro: Batch, logprobs: torch.Tensor, _entropy
        ) -> tuple[torch.Tensor, dict[str, float]]:
            seq = sequence_logps(logprobs, micro[F.LOSS_MASK].to(logprobs.device))
            ref = micro[REF_SEQ_KEY].to(logprobs.device)
            c, r = pair_rows(micro)
            value, metrics = loss_fn(
                seq[c], seq[r], ref[c], ref[r], beta=beta, label_smoothing=label_smoothing
            )
            if nll_weight:
                nll = chosen_nll(seq[c], micro[F.LOSS_MASK][c].sum(-1).to(seq.device))
                value = value + nll_weight * nll
                metrics = {**metrics, "chosen_nll": nll.detach()}
            share = len(c) / pairs
            return value * share, {f"preference/{k}": float(v) * share for k, v in metrics.items()}

        summed = self.backward_rows(arranged, micro_loss, self.optimizer)
        grad_norm = self._clip_and_step()
        out = {k: v for k, v in summed.items() if k.startswith("preference/")}
        out["preference/loss"] = summed[f"{self.metric_prefix}/loss"]
        out.update({"preference/grad_norm": grad_norm, "preference/pairs": float(pairs)})
        return out

    def _kto_step(
        self, batch: Batch, loss_fn, beta: float, desirable_weight: float, undesirable_weight: float
    ) -> dict[str, float]:
        """KTO: z0 from the mismatched rows (no grad, the whole batch on every rank), then the
        labelled rows split over the ranks like any rows (each row's loss stands alone, so neither an
        even micro-batch nor an order is needed)."""
        examples, mismatched = kto_rows(batch)
        ref = sequence_logps(batch[F.REF_LOGPROBS].float(), batch[F.LOSS_MASK])
        kl_part = batch.index(mismatched)
        kl_logps = sequence_logps(self.compute_logprobs(kl_part), kl_part[F.LOSS_MASK])
        ref_kl = ref[mismatched]
        rows = batch.index(examples)
        rows[REF_SEQ_KEY] = ref[examples]
        n = len(examples)
        n_desirable = int(rows[F.PREFERENCE_LABEL].bool().sum())
        weights = {"desirable_weight": desirable_weight, "undesirable_weight": undesirable_weight}

        def micro_loss(
            micro: Batch, logprobs: torch.Tensor, _entropy
        ) -> tuple[torch.Tensor, dict[str, float]]:
            device = logprobs.device
            seq = sequence_logps(logprobs, micro[F.LOSS_MASK].to(device))
            desirable = micro[F.PREFERENCE_LABEL].bool().to(device)
            value, metrics = loss_fn(
                seq,
                micro[REF_SEQ_KEY].to(device),
                desirable,
                kl_logps.to(device),
                ref_kl.to(device),
                beta=beta,
                **weights,
            )
            k, d = len(seq), int(desirable.sum())
            # each metric enters the sum with its share of the rows it averages over, so the sum over
            # micro-batches and ranks is the whole batch's value (a micro-batch may hold one label only)
            shares = {
                "rewards_chosen": d / max(n_desirable, 1),
                "rewards_rejected": (k - d) / max(n - n_desirable, 1),
            }
            out = {
                f"preference/{name}": float(v) * shares.get(name, k / n)
                for name, v in metrics.items()
                if name != "reward_margin"  # a difference of two batch means: taken after the sum
            }
            return value * (k / n), out

        summed = self.backward_rows(rows, micro_loss, self.optimizer)
        grad_norm = self._clip_and_step()
        out = {k: v for k, v in summed.items() if k.startswith("preference/")}
        out["preference/loss"] = summed[f"{self.metric_prefix}/loss"]
        if 0 < n_desirable < n:
            out["preference/reward_margin"] = (
                out["preference/rewards_chosen"] - out["preference/rewards_rejected"]
            )
        out.update({"preference/grad_norm": grad_norm, "preference/examples": float(n)})
        return out
