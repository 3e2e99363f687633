"""The PPO update loop shared by the policy backends (hf, megatron).

A backend supplies ``cfg``, ``model``, ``optimizer``, ``token_logprobs(batch)``, ``_clip_and_step()``
and either ``micro_objective(micro, num_tokens=, num_seqs=, norm_length=)`` (used by the default
``accumulate_gradients``) or its own ``accumulate_gradients`` (megatron: data/pipeline parallel).
The loop (PPO epochs x mini-batches x micro-batches with exact gradient accumulation through global
normalisers) and the no-grad micro-batched log-probs are the same for all of them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.models.training.microbatch import MicroBatch, gather_micro_outputs, micro_batches
from nemo_azr.models.training.no_grad_budget import no_grad_token_budget

#: Metrics that are already divided by the global normalisers, so micro-batch values add up.
SUMMED_METRICS = (
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/entropy",
    "actor/loss",
    "critic/vf_loss",
    "critic/loss",
)
#: Metrics that are maxima: the largest micro-batch value (the importance weights computed in the
#: loss, algorithm.off_policy_correction without a separate old-log-prob pass).
MAX_METRICS = ("off_policy/is_weight_max", "off_policy/is_ratio_max")


def micro_metric(key: str, value: float, weight: float) -> float:
    """One micro-batch metric as it enters the sum over micro-batches: as it is for the summed
    losses and the maxima, else times ``weight`` (its share of the mini-batch tokens)."""
    return float(value) if key in SUMMED_METRICS or key in MAX_METRICS else float(value) * weight


def merge_rank_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """The data-parallel ranks' metric sums combined: maxima by max, everything else added."""
    merged: dict[str, float] = defaultdict(float)
    for part in parts:
        for k, v in part.items():
            merged[k] = max(merged.get(k, 0.0), v) if k in MAX_METRICS else merged[k] + v
    return dict(merged)


def in_loss_rollout_logprobs(
    micro: Batch, old: torch.Tensor | None, correction: str, device: torch.device
) -> torch.Tensor | None:
    """The rollout log-probs the loss weighs with, or None. Without old log-probs (one on-policy
    optimizer step: pi_old is the update's own, detached) an off-policy correction computes its
    weights in the loss, and the trainer skipped both the old-log-prob pass and weighting the
    advantages (decision 127)."""
    if old is not None or correction == "none":
        return None
    return micro[F.ROLLOUT_LOGPROBS].to(device)


def add_micro_metrics(
    acc: dict[str, float],
    loss: torch.Tensor,
    metrics: dict[str, float],
    *,
    weight: float,
    prefix: str = "actor",
) -> None:
    """Add one micro-batch's loss and metrics to ``acc`` (``weight``: its share of the mini-batch
    tokens); the loss goes to ``<prefix>/loss``."""
    acc[f"{prefix}/loss"] += float(loss.detach())
    for k, v in metrics.items():
        if k in MAX_METRICS:
            acc[k] = max(acc.get(k, 0.0), float(v))
        else:
            acc[k] += micro_metric(k, v, weight)


class PPOUpdateMixin:
    """The update loop of a trained model: the policy (``actor/*`` metrics) or the critic
    (``critic/*``); a subclass sets ``metric_prefix`` and may override :meth:`update_schedule`."""

    metric_prefix = "actor"

    def update_schedule(self) -> tuple[int, int, bool]:
        """(epochs, rows per optimizer step (0: all), shuffle) of :meth:`update`."""
        alg = self.cfg.algorithm
        return alg.ppo_epochs, alg.mini_batch_size, alg.shuffle_mini_batches

    def micro_batch_rows(self) -> int:
        return self.cfg.algorithm.micro_batch_size

    def micro_batches(self, batch: Batch, *, no_grad: bool = False) -> list[MicroBatch]:
        """``batch`` in forward/backward pieces: ``micro_batch_rows()`` rows each, or by the token
        budget ``algorithm.max_tokens_per_microbatch`` (models/training/microbatch.py). ``no_grad``
        (old / reference log-probs, values): ``algorithm.logprob_micro_batch_size`` rows each when
        it is set, since a pass that keeps no activations fits more rows and launches fewer kernels;
        unset, on CUDA, by the memory budget of :mod:`.no_grad_budget` (never fewer tokens than a
        training micro-batch), on a CPU the training micro-batches."""
        alg = self.cfg.algorithm
        rows, max_tokens = self.micro_batch_rows(), alg.max_tokens_per_microbatch
        if no_grad and alg.logprob_micro_batch_size > 0:
            rows, max_tokens = alg.logprob_micro_batch_size, 0
        elif no_grad and self.device.type == "cuda":
            training_tokens = max_tokens or rows * batch.seq_len
            dtype_bytes = next(self.model.parameters()).element_size()
            budget = no_grad_token_budget(self.decoder_config(), dtype_bytes, self.device)
            max_tokens = max(budget, training_tokens)
        return micro_batches(batch, rows=rows, max_tokens=max_tokens, packed=self.cfg.model.sequence_packing)

    def decoder_config(self):
        """The transformers config of the trained decoder (sizes for the no-grad token budget)."""
        return self.model.config

    @torch.no_grad()
    def no_grad_pass(
        self, batch: Batch, per_token: Callable[[Batch], torch.Tensor], *, skip_untrained: bool = False
    ) -> torch.Tensor:
        """``per_token(micro)`` ``[b, t]`` over ``batch``'s micro-batches in eval mode, without
        gradients, gathered into ``[B, T]`` (float32, CPU) in row order. ``skip_untrained``: a
        micro-batch with no trained token is not run (``per_token`` must be 0 off ``loss_mask``)."""
        was_training = self.model.training
        self.model.eval()
        parts = [
            (
                micro,
                _zeros_like_ids(micro.batch)
                if skip_untrained and _untrained(micro.batch)
                else per_token(micro.batch),
            )
            for micro in self.micro_batches(batch, no_grad=True)
        ]
        self.model.train(was_training)
        return gather_micro_outputs(parts, len(batch), batch.seq_len)

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """No-grad log-probs[B, T] in micro-batches (old / reference log-probs)."""
        return self.no_grad_pass(batch, self.token_logprobs, skip_untrained=True)

    def accumulate_gradients(self, mb: Batch, *, num_tokens: float, norm_length: int) -> dict[str, float]:
        """Backward of one mini-batch in micro-batches; its metrics (token-weighted means, or sums of
        the already-normalised losses). Backends with pipeline/data parallelism override it."""
        step_metrics: dict[str, float] = defaultdict(float)
        for micro in (m.batch for m in self.micro_batches(mb)):
            if _untrained(micro):  # every term of every loss is masked by loss_mask: exactly 0
                continue
            loss, m = self.micro_objective(
                micro, num_tokens=num_tokens, num_seqs=len(mb), norm_length=norm_length
            )
            loss.backward()
            weight = float(micro[F.LOSS_MASK].sum()) / num_tokens
            add_micro_metrics(step_metrics, loss, m, weight=weight, prefix=self.metric_prefix)
        return dict(step_metrics)

    # --- RL update -------------------------------------------------------------------------------
    def update(self, batch: Batch, ctx: UpdateContext) -> dict[str, float]:
        """PPO epochs over mini-batches; micro-batches accumulate gradients; one optimizer step per mini-batch."""
        if self.optimizer is None:
            raise RuntimeError("setup_optimizer() must be called before update()")
        epochs, mini_batch_size, shuffle = self.update_schedule()
        prefix = self.metric_prefix
        rows = len(batch)
        mini = mini_batch_size or rows
        sums: dict[str, float] = defaultdict(float)
        n_steps = 0
        skipped = 0
        for _ in range(epochs):
            order = torch.randperm(rows, generator=ctx.generator) if shuffle else torch.arange(rows)
            for rows_idx in order.split(mini):
                if self.cfg.model.shared_prefix:
                    # The order within a mini-batch does not change its gradient; the batch's order
                    # keeps the rows of a prompt / an answer adjacent, so they share a micro-batch.
                    rows_idx = rows_idx.sort().values
                mb = batch.index(rows_idx)
                n_tok = float(mb[F.LOSS_MASK].sum())
                if n_tok == 0:
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                step_metrics = self.accumulate_gradients(mb, num_tokens=n_tok, norm_length=ctx.norm_length)
                grad_norm = self._clip_and_step()
                step_metrics[f"{prefix}/grad_norm"] = grad_norm
                if not math.isfinite(grad_norm):
                    skipped += 1
                for k, v in step_metrics.items():
                    sums[k] += v
                n_steps += 1
        out = {k: v / max(1, n_steps) for k, v in sums.items()}
        out[f"{prefix}/lr"] = self.optimizer.param_groups[0]["lr"]
        out[f"{prefix}/optimizer_steps"] = float(n_steps - skipped)
        out[f"{prefix}/skipped_nonfinite_grad"] = float(skipped)
        return out


def _untrained(batch: Batch) -> bool:
    """No row of ``batch`` has a trained token (e.g. RLCR's greedy answer rows, rlcr.answer_decoding)."""
    return not bool((batch[F.LOSS_MASK] > 0).any())


def _zeros_like_ids(batch: Batch) -> torch.Tensor:
    return torch.zeros(batch[F.INPUT_IDS].shape, dtype=torch.float32)
