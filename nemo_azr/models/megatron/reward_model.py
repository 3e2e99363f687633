"""``nemo-azr train-rm`` on the megatron backend: a reward model trained at any TP / PP / DP layout.

The trunk is built and loaded as the policy's (:class:`MegatronPolicy`: an HF folder or a megatron
checkpoint), with a one-output linear score head (no bias, as transformers' ``score``) on the last
pipeline stage in place of the LM head, replicated over the tensor-parallel ranks like the critic's
value head (:func:`~nemo_azr.models.megatron.logprobs.value_head_outputs`). A row's score is the head
at its last token. The head's outputs are aligned like values (column ``t``: the head at position
``t - 1``), so each row carries one extra padding token after its reply and its loss mask marks that
column alone; attention is causal, so the extra token changes no earlier position.

The Bradley-Terry loss compares a pair's two rows, so both go into one micro-batch on one
data-parallel rank (:func:`~nemo_azr.models.megatron.preference.pair_major_order`, as in the DPO
step); each micro-batch's mean loss is weighted by its share of the step's pairs, so the gradient
summed over micro-batches and ranks is that of the mean over all pairs, which the hf trainer
computes in one forward.

The trained model is written as a transformers ``AutoModelForSequenceClassification`` folder (the
trunk gathered into the HF layout, the head as ``score.weight``): the RL run scores with it on any
backend (``rewards/reward_model.py``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_azr.algorithms.bradley_terry import bradley_terry_loss
from nemo_azr.config.schema import NemoAzrConfig, OptimConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.distributed.parallel import global_rank, world_size
from nemo_azr.errors import ConfigError
from nemo_azr.models.megatron.logprobs import VALUE_HEAD, megatron_token_values, value_head_outputs
from nemo_azr.models.megatron.policy import MegatronPolicy
from nemo_azr.models.megatron.preference import pair_major_order
from nemo_azr.models.training.reward_head import init_score_head_, reward_model_optim

__all__ = ["MegatronRewardModelTrainer", "check_megatron_reward_model", "pair_micro_batch"]

Rows = Sequence[tuple[list[int], list[int]]]
#: Per-row flag carried through the micro-batches: 1 for a pair's chosen reply, 0 for its rejected one.
CHOSEN_KEY = "rm_chosen"


def check_megatron_reward_model(cfg: NemoAzrConfig, micro_batch_rows: int, dp: int) -> None:
    """A pair's two rows must share a micro-batch and a data-parallel rank, and every micro-batch
    holds the same rows (the pipeline schedule's fixed shape)."""
    pairs = cfg.reward_model.train_pairs_per_step
    if pairs % dp:
        raise ConfigError(
            f"train-rm on megatron: reward_model.train_pairs_per_step={pairs} does not split evenly over "
            f"{dp} data-parallel ranks; make it a multiple of {dp}"
        )
    if micro_batch_rows % 2:
        raise ConfigError(
            f"train-rm on megatron: parallel.micro_batch_size={micro_batch_rows} must be even (a pair's "
            "two replies go into one micro-batch)"
        )
    if (2 * pairs // dp) % micro_batch_rows:
        raise ConfigError(
            f"train-rm on megatron: parallel.micro_batch_size={micro_batch_rows} does not divide a rank's "
            f"{2 * pairs // dp} rows a step (reward_model.train_pairs_per_step={pairs} pairs over {dp} "
            "data-parallel ranks); pick a divisor, or 0 to derive one"
        )
    if cfg.algorithm.max_tokens_per_microbatch > 0:
        raise ConfigError(
            "train-rm on megatron: algorithm.max_tokens_per_microbatch must be 0 (token-budget "
            "micro-batches would split pairs)"
        )
    if cfg.model.sequence_packing:
        raise ConfigError("train-rm on megatron: model.sequence_packing must be false (packing splits pairs)")


def pair_micro_batch(pairs_per_rank: int, cap_rows: int) -> int:
    """``parallel.micro_batch_size=0``: two rows (one pair) times the largest divisor of a rank's
    pairs a step whose rows stay within ``algorithm.micro_batch_size``."""
    most = max(1, cap_rows // 2)
    return 2 * max(d for d in range(1, max(1, pairs_per_rank) + 1) if pairs_per_rank % d == 0 and d <= most)


def _as_pair_rows(cfg: NemoAzrConfig) -> NemoAzrConfig:
    """``cfg`` checked for pairs, with its rows a step described as the layout validator counts RL rows
    (``prompts_per_step x n_samples``: pairs x 2) and the micro-batch resolved, so that validator
    (heads over TP, layers over PP, rows over DP) checks the pair rows, not a rollout's."""
    import os

    from nemo_azr.distributed.parallel import ParallelLayout

    world = dist.get_world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
    dp = ParallelLayout.from_config(cfg.parallel).data_parallel_size(world)
    pairs = cfg.reward_model.train_pairs_per_step
    micro = cfg.parallel.micro_batch_size or pair_micro_batch(
        max(1, pairs // dp), cfg.algorithm.micro_batch_size
    )
    check_megatron_reward_model(cfg, micro, dp)
    return dataclasses.replace(
        cfg,
        data=dataclasses.replace(cfg.data, prompts_per_step=pairs),
        generation=dataclasses.replace(cfg.generation, n_samples=2),
        parallel=dataclasses.replace(cfg.parallel, micro_batch_size=micro),
    )


class MegatronRewardModelTrainer(MegatronPolicy):
    """The policy's trunk with a score head, trained on pairs (``PairwiseRewardModelTrainer``)."""

    pipeline_head = staticmethod(value_head_outputs)
    metric_prefix = "rm"

    def __init__(self, base: Path, cfg: NemoAzrConfig, pad_id: int) -> None:
        self.pad_id = pad_id
        super().__init__(base, _as_pair_rows(cfg), trainable=True)
        self.setup_optimizer(total_steps=1)

    def _optim_config(self) -> OptimConfig:
        return reward_model_optim(self.cfg)

    def _attach_heads(self) -> None:
        for chunk in self.chunks:
            if chunk.post_process:  # the last pipeline stage (its last virtual chunk)
                param = next(chunk.parameters())
                head = torch.nn.Linear(
                    self.hf_config.hidden_size, 1, bias=False, dtype=param.dtype, device=param.device
                )
                init_score_head_(head.weight, self.hf_config.initializer_range, self.cfg.seed)
                setattr(chunk, VALUE_HEAD, head)

    # --- scores ----------------------------------------------------------------------------------
    def token_logprobs(
        self, batch: Batch, *, mask_key: str = F.LOSS_MASK, return_entropy: bool = False
    ) -> torch.Tensor:
        """The head's outputs ``[B, T]`` where ``batch[mask_key]`` is 1 (the update loop and
        ``compute_logprobs`` call it under the policy's name). Differentiable on one stage."""
        values = megatron_token_values(
            self.chunks,
            batch[F.INPUT_IDS],
            batch[F.ATTENTION_MASK],
            batch.get(F.POSITION_IDS),
            num_heads=1,
            micro_batch_size=self.micro_batch_size,
            max_tokens=self._max_tokens,
        )[0]
        return values * (batch[mask_key].to(values.device) > 0)

    def _loss_inputs(
        self, batch: Batch, columns: list[torch.Tensor], entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return columns[0], None

    def _pair_batch(self, rows: Rows) -> Batch:
        """Rows chosen, rejected, chosen, ... each ending in one extra pad token whose column (the
        head at the reply's last token) is the only one marked in ``loss_mask``."""
        flat = [ids for pair in rows for ids in pair]
        width = max(len(ids) for ids in flat) + 1
        input_ids = torch.full((len(flat), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(flat), width), dtype=torch.long)
        loss_mask = torch.zeros((len(flat), width), dtype=torch.float32)
        for i, ids in enumerate(flat):
            input_ids[i, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention[i, : len(ids) + 1] = 1
            loss_mask[i, len(ids)] = 1.0
        chosen = torch.tensor([1.0, 0.0] * len(rows))
        return Batch(
            {F.INPUT_IDS: input_ids, F.ATTENTION_MASK: attention, F.LOSS_MASK: loss_mask, CHOSEN_KEY: chosen}
        )

    def pair_step(self, rows: Rows) -> tuple[float, float, float]:
        batch = self._pair_batch(rows)
        chosen_rows = torch.arange(0, len(batch), 2)
        arranged = batch.index(pair_major_order(chosen_rows, chosen_rows + 1, self._dp()[1]))
        pairs = len(rows)

        def micro_loss(micro: Batch, values: torch.Tensor, _entropy) -> tuple[torch.Tensor, dict[str, float]]:
            scores = values.sum(-1)  # one marked column a row
            is_chosen = micro[CHOSEN_KEY].to(values.device) > 0
            loss, acc = bradley_terry_loss(scores[is_chosen], scores[~is_chosen])
            share = int(is_chosen.sum()) / pairs
            return loss * share, {"rm/accuracy": float(acc) * share}

        summed = self.backward_rows(arranged, micro_loss, self.optimizer)
        grad_norm = self._clip_and_step()
        return summed[f"{self.metric_prefix}/loss"], summed["rm/accuracy"], grad_norm

    @torch.no_grad()
    def pair_scores(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        scores = self.compute_logprobs(self._pair_batch(rows)).sum(-1)  # every rank: all rows
        return scores[0::2], scores[1::2]

    # --- export ------------------------------------------------------------------------------------
    def _head_on_every_rank(self) -> torch.Tensor:
        """The score head's weight ``[1, H]`` (float32, CPU), sent from the last pipeline stage."""
        from megatron.core import parallel_state as ps

        last = [getattr(c, VALUE_HEAD) for c in self.chunks if c.post_process]
        weight = (
            last[0].weight.detach().float().cpu()
            if last
            else torch.empty(1, self.hf_config.hidden_size, dtype=torch.float32)
        )
        if ps.get_pipeline_model_parallel_world_size() > 1:
            dist.broadcast(
                weight,
                src=ps.get_pipeline_model_parallel_last_rank(),
                group=ps.get_pipeline_model_parallel_group(),
            )
        return weight

    def write(self, folder: Path, tokenizer: Any) -> None:
        """Collective: the HF sequence-classification folder, written by global rank 0."""
        from transformers import AutoModelForSequenceClassification

        state = self.export_hf_state_dict()
        head = self._head_on_every_rank()
        if global_rank() == 0:
            config = copy.deepcopy(self.hf_config)
            config.num_labels = 1
            config.pad_token_id = self.pad_id
            model = AutoModelForSequenceClassification.from_config(
                config, dtype=getattr(torch, self.cfg.model.dtype)
            )
            trunk = {k: v for k, v in state.items() if not k.startswith("lm_head.")}
            model.load_state_dict({**trunk, "score.weight": head.to(model.score.weight.dtype)}, strict=True)
            model.save_pretrained(folder, safe_serialization=True)
            tokenizer.save_pretrained(folder)
        if world_size() > 1:
            dist.barrier()
