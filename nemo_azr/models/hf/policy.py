"""``hf`` policy backend: a transformers causal LM trained with the registered policy losses.

Log-probs never materialise ``[B, T, V]``: the decoder's hidden states of the positions that
predict a loss-masked token are gathered and fed with the output-layer weight to
:func:`nemo_azr.kernels.linear_token_logprobs`, which walks token chunks. The update computes the
policy loss with :func:`nemo_azr.kernels.fused_linear_policy_loss` (``model.fused_policy_loss``,
same loss and metrics as ``policy_objective`` on those log-probs). ``model.kernel_backend`` picks
the kernels (torch chunks, or Triton on CUDA).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from nemo_azr.algorithms.objective import policy_objective
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import position_ids_from_mask
from nemo_azr.errors import BatchContractError, CheckpointError, ConfigError
from nemo_azr.kernels import fused_linear_policy_loss, linear_token_logprobs
from nemo_azr.models.hf.checkpoint import load_training_state, load_weights, save_training_state
from nemo_azr.models.training.microbatch import trim_padding
from nemo_azr.models.training.optim import build_optimizer
from nemo_azr.models.training.packing import packed_decoder_forward
from nemo_azr.models.training.ppo_update import PPOUpdateMixin, in_loss_rollout_logprobs
from nemo_azr.models.training.preference_update import PreferenceUpdateMixin
from nemo_azr.models.training.shared_prefix import shared_prefix_decoder_forward, shared_prefix_width
from nemo_azr.registry import POLICY_BACKENDS
from nemo_azr.utils.precision import resolve_low_precision

hf_logging.disable_progress_bar()

#: Config attributes that change logits beyond ``hidden @ W.T`` (unsupported by the fused path).
_UNSUPPORTED_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logits_scaling", "logit_scale")
#: Budget of one chunk's float32 logits when model.logprob_chunk_size is 0 (auto).
AUTO_CHUNK_BYTES = 64 * 2**20
MIN_AUTO_CHUNK_TOKENS = 16
#: Metrics that are sums over micro-batches (already normalised globally); the rest are token-weighted means.


def auto_chunk_size(vocab_size: int) -> int:
    """Tokens per log-prob chunk so that one chunk's float32 logits take about AUTO_CHUNK_BYTES."""
    return max(MIN_AUTO_CHUNK_TOKENS, AUTO_CHUNK_BYTES // (4 * vocab_size))


def _check_supported(model: torch.nn.Module) -> None:
    for attr in _UNSUPPORTED_LOGIT_TRANSFORMS:
        if getattr(model.config, attr, None):
            raise ConfigError(
                f"model config sets {attr}={getattr(model.config, attr)}; the chunked log-prob path "
                "computes hidden @ W.T only, so this model family is not supported"
            )
    head = model.get_output_embeddings()
    if head is None or getattr(head, "bias", None) is not None:
        raise ConfigError("the model's output layer must be a bias-free Linear (Llama/Qwen2 style)")


def decoder_hidden_states(
    model: torch.nn.Module,
    batch: Batch,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    *,
    packed: bool = False,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last hidden states ``[B, T, H]`` of ``model``'s decoder (its trunk, no head) and
    ``input_ids[B, T]``, on ``device``; positions count each row's real tokens from 0. ``packed``:
    only the real tokens run, as one packed sequence (``model.sequence_packing``, models/training/packing.py).
    ``shared_prefix``: a prefix several rows share runs once (``model.shared_prefix``, models/training/shared_prefix.py)."""
    ids = batch[F.INPUT_IDS].to(device)
    attn = batch[F.ATTENTION_MASK].to(device)
    pos = batch.get(F.POSITION_IDS)
    pos = position_ids_from_mask(attn) if pos is None else pos.to(device)
    decoder = getattr(model, model.base_model_prefix)

    def run() -> torch.Tensor:
        if packed:
            return packed_decoder_forward(decoder, ids, attn, pos)
        if shared_prefix:
            width = shared_prefix_width(batch.get(F.LOSS_MASK), ids.shape[1])
            hidden = shared_prefix_decoder_forward(decoder, ids, attn, pos, width)
            if hidden is not None:
                return hidden
        return decoder(
            input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False
        ).last_hidden_state

    if autocast_dtype is None:
        return run(), ids
    # Mixed precision: the decoder's matmuls in autocast_dtype, weights (and their gradients) in
    # model.dtype; the head (LM head + log-softmax, or a value head) runs on the hidden states cast back.
    with torch.autocast(device.type, dtype=autocast_dtype):
        hidden = run()
    return hidden.to(model.dtype), ids


def forward_layout(model_cfg) -> dict[str, bool]:
    """:func:`decoder_hidden_states`' layout keywords from ``cfg.model`` (policy and critic alike)."""
    return {"packed": model_cfg.sequence_packing, "shared_prefix": model_cfg.shared_prefix}


@POLICY_BACKENDS.register("hf")
class HFPolicy(PPOUpdateMixin, PreferenceUpdateMixin):
    """Trainable (actor) or frozen (reference) transformers causal LM."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: NemoAzrConfig,
        *,
        trainable: bool = True,
        device: str | torch.device = "cpu",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=getattr(torch, cfg.model.dtype)
        )
        _check_supported(self.model)
        self.model.to(self.device)
        self.trainable = trainable
        self.temperature = cfg.generation.temperature
        self.chunk_size = cfg.model.logprob_chunk_size or auto_chunk_size(self.model.config.vocab_size)
        self.kernel_backend = cfg.model.kernel_backend
        self.fused_loss = cfg.model.fused_policy_loss
        self.autocast_dtype = resolve_low_precision(
            cfg.model.autocast_dtype, self.device, "model.autocast_dtype"
        )
        if trainable:
            self.model.train()
            if cfg.model.gradient_checkpointing:
                # transformers 5.x renamed it (the old name warns, and goes in v6)
                enable = getattr(self.model, "activation_checkpointing_enable", None)
                (enable or self.model.gradient_checkpointing_enable)()
        else:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        # critic.shared_trunk: a value head on this model's trunk, trained by the joint loss
        # (attach_value_head); its roles are the critic's.
        self.value_head: torch.nn.Linear | None = None
        self.value_roles: list[str] = []

    # --- what generation and checkpoints read (contracts.policy.Policy) -----------------------------
    @property
    def hf_config(self):
        """The trained model's transformers config."""
        return self.model.config

    def generation_model(self) -> torch.nn.Module:
        """The module a generation backend copies: the trained model itself."""
        return self.model

    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights in transformers' layout (a refit loads them into a generation copy)."""
        return self.model.state_dict()

    # --- optimisation set-up ----------------------------------------------------------------------
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The model's parameters and, with a shared-trunk critic, its value head's."""
        head = list(self.value_head.parameters()) if self.value_head is not None else []
        return [*self.model.parameters(), *head]

    def setup_optimizer(self, total_steps: int) -> None:
        self.optimizer, self.scheduler = build_optimizer(
            self.trainable_parameters(), self.cfg.optim, total_steps=total_steps
        )

    def attach_value_head(self, roles: list[str]) -> torch.nn.Linear:
        """A zero-initialised ``Linear(H, roles)`` on the trunk (``critic.shared_trunk``): the update
        then adds ``critic.value_loss_coef`` x the clipped value loss to the policy loss. Call it
        before :meth:`setup_optimizer`."""
        weight = self.model.get_output_embeddings().weight
        self.value_head = torch.nn.Linear(weight.shape[1], len(roles), dtype=weight.dtype, device=self.device)
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self.value_roles = list(roles)
        return self.value_head

    def values_from_hidden(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``values[B, T]`` of the value head on ``hidden[B, T, H]``: each row's role head at the
        position before each trained token (aligned like the log-probs), 0 elsewhere."""
        from nemo_azr.models.training.critic_common import pick_role_values

        per_head = torch.nn.functional.pad(self.value_head(hidden[:, :-1]).float().permute(2, 0, 1), (1, 0))
        return pick_role_values(per_head, batch, self.value_roles) * (batch[F.LOSS_MASK].to(self.device) > 0)

    def token_values(self, batch: Batch) -> torch.Tensor:
        """``values[B, T]`` of the shared-trunk value head (see :meth:`values_from_hidden`)."""
        hidden, _ = self._hidden_states(batch)
        return self.values_from_hidden(hidden, batch)

    # --- log-probs -------------------------------------------------------------------------------
    def _hidden_states(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's last hidden states ``[B, T, H]`` and ``input_ids[B, T]`` on the device."""
        return decoder_hidden_states(
            self.model, batch, self.device, self.autocast_dtype, **forward_layout(self.cfg.model)
        )

    def token_logprobs(
        self, batch: Batch, *, mask_key: str = F.LOSS_MASK, return_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """logprobs[B, T] of ``input_ids`` at the columns where ``batch[mask_key]`` is 1 (0 elsewhere).

        With ``return_entropy`` also the (differentiable) entropy ``[B, T]`` of the same positions.
        """
        hidden, ids = self._hidden_states(batch)
        return self._logprobs_from_hidden(
            hidden, ids, batch, mask_key=mask_key, return_entropy=return_entropy
        )

    def _at_row_temperatures(self, hidden: torch.Tensor, batch: Batch) -> torch.Tensor:
        """``hidden[B, T, H]`` scaled so that the LM head at ``self.temperature`` gives each row's logits
        at its own ``sampling_temperature`` (``h W / t_row = (h * t / t_row) W / t``): exact, and
        the kernels keep one scalar temperature. Unchanged when the batch has no per-row temperatures."""
        temps = batch.get(F.SAMPLING_TEMPERATURE)
        if temps is None:
            return hidden
        scale = self.temperature / temps.to(device=hidden.device, dtype=torch.float32)
        return hidden * scale.to(hidden.dtype)[:, None, None]

    def _logprobs_from_hidden(
        self, hidden: torch.Tensor, ids: torch.Tensor, batch: Batch, *, mask_key: str, return_entropy: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # Token t is predicted from position t-1, so only positions before a trained token matter.
        target = batch[mask_key].to(self.device)[:, 1:] > 0
        hidden = self._at_row_temperatures(hidden, batch)
        out = linear_token_logprobs(
            hidden[:, :-1][target],
            self.model.get_output_embeddings().weight,
            ids[:, 1:][target],
            temperature=self.temperature,
            backend=self.kernel_backend,
            chunk_size=self.chunk_size,
            return_entropy=return_entropy,
        )

        def to_bt(values: torch.Tensor) -> torch.Tensor:
            full = torch.zeros(target.shape, dtype=torch.float32, device=self.device)
            return torch.nn.functional.pad(full.masked_scatter(target, values), (1, 0))

        if return_entropy:
            return to_bt(out[0]), to_bt(out[1])
        return to_bt(out)

    # --- RL update: PPOUpdateMixin (models/training/ppo_update.py) ---------------------------------------
    def micro_objective(
        self, micro: Batch, *, num_tokens: float, num_seqs: int, norm_length: int, fused: bool | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics of one micro-batch (global normalisers given), fused or via ``policy_objective``.

        ``fused`` defaults to ``model.fused_policy_loss``. Both paths give the same loss and metrics;
        the entropy term is computed when ``algorithm.entropy_coef > 0``.
        """
        alg = self.cfg.algorithm
        fused = self.fused_loss if fused is None else fused
        # On-policy single step without old log-probs: the current ones, detached (see the trainer).
        old = micro[F.OLD_LOGPROBS].to(self.device) if F.OLD_LOGPROBS in micro else None
        rollout = in_loss_rollout_logprobs(micro, old, alg.off_policy_correction, self.device)
        ref = micro.get(F.REF_LOGPROBS)
        ref = None if ref is None else ref.to(self.device)
        kl_weight = micro.get(F.KL_WEIGHT)
        advantages = micro[F.ADVANTAGES].to(self.device)
        mask = micro[F.LOSS_MASK].to(self.device)
        norms = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
        with_entropy = alg.entropy_coef > 0
        if fused:
            if bool((mask[:, 0] > 0).any()):
                raise BatchContractError("loss_mask[:, 0] must be 0: the first token has no prediction")
            hidden, ids = self._hidden_states(micro)

            def shifted(x: torch.Tensor | None) -> torch.Tensor | None:
                return None if x is None else x[:, 1:]

            # hidden[:, t] predicts ids[:, t + 1]: align everything on the predicted token.
            loss, metrics = fused_linear_policy_loss(
                self._at_row_temperatures(hidden, micro)[:, :-1],
                self.model.get_output_embeddings().weight,
                ids[:, 1:],
                advantages=advantages[:, 1:],
                loss_mask=mask[:, 1:],
                cfg=alg,
                old_logprobs=shifted(old),
                ref_logprobs=shifted(ref),
                rollout_logprobs=shifted(rollout),
                temperature=self.temperature,
                backend=self.kernel_backend,
                chunk_size=self.chunk_size,
                compute_entropy=with_entropy,
                kl_weight=kl_weight,
                **norms,
            )
            return self._add_value_loss(loss, metrics, hidden, micro, norms)
        hidden, ids = self._hidden_states(micro)
        out = self._logprobs_from_hidden(
            hidden, ids, micro, mask_key=F.LOSS_MASK, return_entropy=with_entropy
        )
        logprobs, entropy = out if with_entropy else (out, None)
        loss, metrics = policy_objective(
            logprobs=logprobs,
            old_logprobs=logprobs.detach() if old is None else old,
            advantages=advantages,
            loss_mask=mask,
            cfg=alg,
            ref_logprobs=ref,
            entropy=entropy,
            rollout_logprobs=rollout,
            kl_weight=kl_weight,
            **norms,
        )
        return self._add_value_loss(loss, metrics, hidden, micro, norms)

    def _add_value_loss(
        self, loss: torch.Tensor, metrics: dict[str, float], hidden: torch.Tensor, micro: Batch, norms: dict
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Shared-trunk critic: ``loss + critic.value_loss_coef x clipped value loss`` on the same
        hidden states (one forward, one backward for both heads); the value metrics join the actor's."""
        if self.value_head is None:
            return loss, metrics
        from nemo_azr.algorithms.value_loss import clipped_value_loss

        c = self.cfg.critic
        value_loss, value_metrics = clipped_value_loss(
            values=self.values_from_hidden(hidden, micro),
            old_values=micro[F.VALUES].to(self.device),
            returns=micro[F.RETURNS].to(self.device),
            loss_mask=micro[F.LOSS_MASK].to(self.device),
            cliprange=c.cliprange_value,
            loss_agg_mode=c.loss_agg_mode,
            **norms,
        )
        return loss + c.value_loss_coef * value_loss, {**metrics, **value_metrics}

    def _clip_and_step(self) -> float:
        params = [p for p in self.trainable_parameters() if p.grad is not None]
        max_norm = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(norm):
            self.optimizer.step()
        # A non-finite gradient would poison the weights: drop it (counted by the caller).
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    # --- supervised warm-up ----------------------------------------------------------------------
    def sft_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The supervised warm-up's optimizer (torch's AdamW defaults at ``lr``)."""
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr)

    def sft_step(self, batch: Batch, optimizer: torch.optim.Optimizer) -> float:
        """One step of mean token NLL over ``loss_mask`` (supervised warm-up), accumulated over
        micro-batches of ``algorithm.micro_batch_size`` rows (each trimmed to its own width), so a
        warm-up batch of long prompts holds one micro-batch's activations at a time."""
        optimizer.zero_grad(set_to_none=True)
        total = batch[F.LOSS_MASK].sum().clamp(min=1).to(self.device)
        loss_sum = 0.0
        # Rows of similar length share a micro-batch (the loss is a sum, so order does not matter).
        batch = batch.index(torch.argsort(batch[F.ATTENTION_MASK].sum(dim=1), descending=True, stable=True))
        for part in batch.split(self.micro_batch_rows()):
            part, _start = trim_padding(part)
            mask = part[F.LOSS_MASK].to(self.device)
            if not mask.any():
                continue
            loss = -(self.token_logprobs(part) * mask).sum() / total
            loss.backward()
            loss_sum += float(loss.detach())
        loss = torch.tensor(loss_sum)
        if self.cfg.optim.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    # --- checkpoint ------------------------------------------------------------------------------
    def save(self, folder: Path, *, tokenizer=None) -> None:
        self.model.save_pretrained(folder / "model")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder / "model")
        if self.optimizer is not None:
            save_training_state(self.optimizer, self.scheduler, folder / "optimizer.pt")

    def load(self, folder: Path) -> None:
        weights = folder / "model" / "model.safetensors"
        if not weights.is_file():
            raise CheckpointError(f"{folder} has no model/model.safetensors")
        load_weights(
            self.model,
            weights,
            device=self.device,
            where=f"checkpoint {folder}: model/model.safetensors",
            misfit="does not fit this model (another model shape?)",
        )
        if self.optimizer is not None:
            load_training_state(
                self.optimizer,
                self.scheduler,
                folder / "optimizer.pt",
                where=f"checkpoint {folder}: optimizer.pt",
            )
