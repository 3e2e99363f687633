"""``megatron`` critic: PPO's value model as a megatron-core ``GPTModel`` trunk with a value head.

The trunk is built and loaded exactly like the policy (:class:`MegatronPolicy`: HF weights or a
megatron checkpoint, TP/PP/DP, the distributed optimizer) and shares its process groups. The value
head, ``Linear(H, roles)`` starting at zero, sits on the last pipeline stage (``GPTModel.value_head``)
and is replicated over the tensor-parallel ranks, which all hold the full final hidden states
(:func:`~nemo_azr.models.megatron.logprobs.value_head_outputs`); the LM head is never applied. So
values equal the ``hf`` critic's for the same weights, and one update step equals its step.

Checkpoint: ``critic/dist`` (``dist_checkpointing``: the head is a replicated tensor of the last stage,
so it reshards to any TP/PP/DP like the trunk) and ``critic/config.json`` (the HF config).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nemo_azr.algorithms.value_loss import clipped_value_loss
from nemo_azr.config.schema import NemoAzrConfig, OptimConfig
from nemo_azr.contracts import Batch, Role
from nemo_azr.contracts import fields as F
from nemo_azr.distributed.parallel import global_rank
from nemo_azr.errors import CheckpointError
from nemo_azr.models.megatron.dist_ckpt import load_dist_checkpoint, save_dist_checkpoint
from nemo_azr.models.megatron.logprobs import VALUE_HEAD, megatron_token_values, value_head_outputs
from nemo_azr.models.megatron.policy import MegatronPolicy
from nemo_azr.models.training.critic_common import (
    CRITIC_DIR,
    NO_CRITIC_HINT,
    ValueModelMixin,
    pick_role_values,
)
from nemo_azr.models.training.ppo_update import micro_metric
from nemo_azr.registry import CRITIC_BACKENDS

__all__ = ["MegatronCritic"]


@CRITIC_BACKENDS.register("megatron")
class MegatronCritic(ValueModelMixin, MegatronPolicy):
    """Value model on the policy's parallel layout (built after the policy: it shares its groups)."""

    pipeline_head = staticmethod(value_head_outputs)

    def __init__(
        self,
        model_path: str | Path,
        cfg: NemoAzrConfig,
        *,
        roles: Sequence[str] = (Role.SOLVER.value,),
        device: str | torch.device = "cpu",
    ) -> None:
        self.roles = list(roles)
        super().__init__(model_path, cfg, trainable=True, device=device, share_parallel_groups=True)

    def _optim_config(self) -> OptimConfig:
        return self.cfg.critic.optim

    def _attach_heads(self) -> None:
        for chunk in self.chunks:
            if chunk.post_process:  # the last pipeline stage (its last virtual chunk)
                head = torch.nn.Linear(
                    self.hf_config.hidden_size,
                    len(self.roles),
                    dtype=next(chunk.parameters()).dtype,
                    device=next(chunk.parameters()).device,
                )
                torch.nn.init.zeros_(head.weight)
                torch.nn.init.zeros_(head.bias)
                setattr(chunk, VALUE_HEAD, head)

    # --- values ----------------------------------------------------------------------------------
    def token_logprobs(
        self, batch: Batch, *, mask_key: str = F.LOSS_MASK, return_entropy: bool = False
    ) -> torch.Tensor:
        """``values[B, T]`` of each row's role head where ``batch[mask_key]`` is 1 (the update loop
        and ``compute_logprobs`` call it under the policy's name). Differentiable on one stage."""
        per_head = megatron_token_values(
            self.chunks,
            batch[F.INPUT_IDS],
            batch[F.ATTENTION_MASK],
            batch.get(F.POSITION_IDS),
            num_heads=len(self.roles),
            micro_batch_size=self.micro_batch_size,
            max_tokens=self._max_tokens,
        )
        values = pick_role_values(per_head, batch, self.roles)
        return values * (batch[mask_key].to(values.device) > 0)

    token_values = token_logprobs

    def _loss_inputs(
        self, batch: Batch, columns: list[torch.Tensor], entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return pick_role_values(torch.stack(columns), batch, self.roles), None

    # --- training ----------------------------------------------------------------------------------
    def accumulate_gradients(self, mb: Batch, *, num_tokens: float, norm_length: int) -> dict[str, float]:
        c = self.cfg.critic

        def objective(
            micro: Batch, values: torch.Tensor, _entropy: None
        ) -> tuple[torch.Tensor, dict[str, float]]:
            loss, m = clipped_value_loss(
                values=values,
                old_values=micro[F.VALUES].to(values.device),
                returns=micro[F.RETURNS].to(values.device),
                loss_mask=micro[F.LOSS_MASK].to(values.device),
                cliprange=c.cliprange_value,
                loss_agg_mode=c.loss_agg_mode,
                num_tokens=num_tokens,
                num_seqs=len(mb),
                norm_length=norm_length,
            )
            weight = float(micro[F.LOSS_MASK].sum()) / num_tokens
            return loss, {k: micro_metric(k, v, weight) for k, v in m.items()}

        return self.backward_rows(mb, objective, self.optimizer)

    # --- checkpoint ------------------------------------------------------------------------------
    def save(self, folder: Path, *, tokenizer: Any = None, on_written: Any = None) -> None:
        """Collective: ``folder/dist`` (every rank's shards, the optimizer with them) and the HF
        config (rank 0)."""
        if global_rank() == 0:
            folder.mkdir(parents=True, exist_ok=True)
            self.hf_config.save_pretrained(folder)
        save_dist_checkpoint(self.chunks, self.optimizer, self.scheduler, folder / "dist")

    def load(self, folder: Path) -> None:
        if not (folder / "dist").is_dir():
            raise CheckpointError(f"{folder.parent} has no critic ({CRITIC_DIR}/dist): {NO_CRITIC_HINT}")
        load_dist_checkpoint(self.chunks, self.optimizer, self.scheduler, folder / "dist")
