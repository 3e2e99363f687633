"""``hf`` critic: PPO's value model, a transformers trunk with one scalar head per role.

The model is transformers' own ``AutoModelForTokenClassification`` (``num_labels`` = number of
roles), so a saved critic is a plain HF folder that loads anywhere. Its trunk starts from the
policy's weights (``critic.model_path``, default ``model.path``); the head starts at zero, so the
first values are 0 everywhere (a neutral baseline) and the first update trains the head alone.
Values are aligned like the log-probs: ``values[:, t]`` is the head's output at position ``t - 1``,
the state from which token ``t`` is chosen, and 0 where ``loss_mask`` is 0. A row reads the head
of its ``role`` (self-play: solver and proposer never share a baseline).

Training: the clipped value loss (:mod:`nemo_azr.algorithms.value_loss`) in the shared update loop
(:class:`~nemo_azr.models.training.ppo_update.PPOUpdateMixin`: epochs x mini-batches x micro-batches with
the mini-batch's normalisers), its own AdamW and schedule (``critic.optim``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForTokenClassification
from transformers.utils import logging as hf_logging

from nemo_azr.algorithms.value_loss import clipped_value_loss
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch, Role
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.errors import CheckpointError
from nemo_azr.models.hf.checkpoint import load_training_state, load_weights, save_training_state
from nemo_azr.models.hf.policy import decoder_hidden_states, forward_layout
from nemo_azr.models.training.critic_common import (
    CRITIC_DIR,
    NO_CRITIC_HINT,
    ValueModelMixin,
    pick_role_values,
    require_value_targets,
    value_batch_metrics,
)
from nemo_azr.models.training.optim import build_optimizer
from nemo_azr.models.training.ppo_update import PPOUpdateMixin
from nemo_azr.registry import CRITIC_BACKENDS
from nemo_azr.utils.precision import resolve_low_precision

#: A shared-trunk critic's head inside a checkpoint's ``critic/`` (the trunk is the policy's).
SHARED_HEAD_FILE = "value_head.safetensors"


@CRITIC_BACKENDS.register("hf")
class HFCritic(ValueModelMixin, PPOUpdateMixin):
    """Value model ``V(prefix)`` for GAE, trained on the returns of the same batch."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: NemoAzrConfig,
        *,
        roles: Sequence[str] = (Role.SOLVER.value,),
        device: str | torch.device = "cpu",
    ) -> None:
        self.cfg = cfg
        self.roles = list(roles)
        self.device = torch.device(device)
        config = AutoConfig.from_pretrained(str(model_path))
        config.num_labels = len(self.roles)
        config.classifier_dropout = 0.0  # values must not be noisy; the head is applied without dropout
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "score.* newly initialised" is expected: it is the value head
        try:
            self.model = AutoModelForTokenClassification.from_pretrained(
                str(model_path), config=config, dtype=getattr(torch, cfg.model.dtype)
            )
        finally:
            hf_logging.set_verbosity(verbosity)
        with torch.no_grad():
            self.model.score.weight.zero_()
            if self.model.score.bias is not None:
                self.model.score.bias.zero_()
        self.model.to(self.device).train()
        if cfg.model.gradient_checkpointing:
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            (enable or self.model.gradient_checkpointing_enable)()
        self.autocast_dtype = resolve_low_precision(
            cfg.model.autocast_dtype, self.device, "model.autocast_dtype"
        )
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None

    # --- schedule ----------------------------------------------------------------------------------
    def micro_batch_rows(self) -> int:
        return self.cfg.critic.micro_batch_size or self.cfg.algorithm.micro_batch_size

    def setup_optimizer(self, total_steps: int) -> None:
        self.optimizer, self.scheduler = build_optimizer(
            self.model.parameters(), self.cfg.critic.optim, total_steps=total_steps
        )

    # --- values ------------------------------------------------------------------------------------
    def token_values(self, batch: Batch) -> torch.Tensor:
        """``values[B, T]`` (float32, differentiable): each row's head at the position before each
        trained token; 0 where ``loss_mask`` is 0."""
        hidden, _ = decoder_hidden_states(
            self.model, batch, self.device, self.autocast_dtype, **forward_layout(self.cfg.model)
        )
        heads = self.model.score(hidden[:, :-1]).float()  # [B, T-1, roles]
        per_head = torch.nn.functional.pad(heads.permute(2, 0, 1), (1, 0))  # [roles, B, T]
        return pick_role_values(per_head, batch, self.roles) * (batch[F.LOSS_MASK].to(self.device) > 0)

    # PPOUpdateMixin.compute_logprobs runs token_logprobs micro-batched under no_grad.
    token_logprobs = token_values

    # --- training ----------------------------------------------------------------------------------
    def micro_objective(
        self, micro: Batch, *, num_tokens: float, num_seqs: int, norm_length: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        values = self.token_values(micro)
        return clipped_value_loss(
            values=values,
            old_values=micro[F.VALUES].to(self.device),
            returns=micro[F.RETURNS].to(self.device),
            loss_mask=micro[F.LOSS_MASK].to(self.device),
            cliprange=self.cfg.critic.cliprange_value,
            loss_agg_mode=self.cfg.critic.loss_agg_mode,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length,
        )

    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.critic.optim.grad_clip if self.cfg.critic.optim.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    # --- checkpoint ------------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """``folder`` (a checkpoint's ``critic/``): the HF token-classification model + optimizer."""
        self.model.save_pretrained(folder)
        if self.optimizer is not None:
            save_training_state(self.optimizer, self.scheduler, folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        weights = folder / "model.safetensors"
        if not weights.is_file():
            raise CheckpointError(
                f"{folder.parent} has no critic ({CRITIC_DIR}/model.safetensors): {NO_CRITIC_HINT}"
            )
        load_weights(
            self.model,
            weights,
            device=self.device,
            where=f"checkpoint {folder.parent}: {CRITIC_DIR}/model.safetensors",
            misfit="does not fit this critic (another model, or another number of value heads?)",
        )
        if self.optimizer is not None:
            where = f"checkpoint {folder.parent}: {CRITIC_DIR}/optimizer.pt"
            load_training_state(self.optimizer, self.scheduler, folder / "optimizer.pt", where=where)


class SharedTrunkCritic(ValueModelMixin):
    """``critic.shared_trunk``: the value head sits on the policy's own trunk
    (:meth:`HFPolicy.attach_value_head`), so policy and critic are one model trained by one joint loss
    in the policy's update (``policy loss + critic.value_loss_coef x value loss``, one optimizer:
    ``optim``). This object computes the rollout-time values and saves the head; its ``update`` only
    measures (the policy's update trains the head). Half the memory and compute of a separate critic;
    the price is that the value gradient shapes the policy's features."""

    def __init__(self, policy, cfg: NemoAzrConfig, *, roles: Sequence[str] = (Role.SOLVER.value,)) -> None:
        self.policy = policy
        self.cfg = cfg
        self.roles = list(roles)
        self.head = policy.attach_value_head(self.roles)

    def setup_optimizer(self, total_steps: int) -> None:
        """Nothing: the policy's optimizer holds the head (attached before it was built)."""

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return self.policy.no_grad_pass(batch, self.policy.token_values)

    def update(self, batch: Batch, ctx: UpdateContext) -> dict[str, float]:
        require_value_targets(batch)
        return value_batch_metrics(batch)

    def save(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in self.head.state_dict().items()}, str(folder / SHARED_HEAD_FILE)
        )

    def load(self, folder: Path) -> None:
        path = folder / SHARED_HEAD_FILE
        if not path.is_file():
            raise CheckpointError(
                f"{folder.parent} has no shared-trunk value head ({CRITIC_DIR}/{SHARED_HEAD_FILE}): {NO_CRITIC_HINT}"
            )
        load_weights(
            self.head,
            path,
            device=self.policy.device,
            where=f"checkpoint {folder.parent}: {CRITIC_DIR}/{SHARED_HEAD_FILE}",
            misfit="does not fit this value head (another number of roles?)",
        )
