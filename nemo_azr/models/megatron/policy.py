"""``megatron`` policy backend: a megatron-core ``GPTModel`` (tensor parallel, PP=1) trained like ``hf``.

Same interface and maths as :class:`nemo_azr.models.hf_policy.HFPolicy` (the non-fused path): the loss
is ``policy_objective`` on the log-probs of :func:`megatron_token_logprobs`, with the same global
normalisers, micro-batch accumulation, AdamW + LR schedule and grad clipping (over the whole model:
the norm sums each tensor-parallel shard once). Every rank runs the same rollout with its own HF
generation copy (``generation_model`` / ``export_hf_state_dict``), so no data is broadcast.

Not implemented yet (one-line ConfigError): pipeline parallelism, data parallelism (dp > 1) and the
entropy bonus (``algorithm.entropy_coef > 0``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_azr.algorithms.objective import policy_objective
from nemo_azr.config.parallel_validate import validate_parallel
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.distributed.parallel import ParallelLayout, initialize_parallel
from nemo_azr.errors import CheckpointError, ConfigError
from nemo_azr.models.hf_policy import auto_chunk_size
from nemo_azr.models.megatron.builder import build_gpt_model
from nemo_azr.models.megatron.hf_adapter import gather_hf_state_dict, load_hf_into_megatron
from nemo_azr.models.megatron.logprobs import megatron_token_logprobs
from nemo_azr.models.optim import build_optimizer
from nemo_azr.models.ppo_update import PPOUpdateMixin
from nemo_azr.registry import POLICY_BACKENDS

__all__ = ["MegatronPolicy"]

PP_UNSUPPORTED = "pipeline-parallel training is not implemented yet; use parallel=tp2pp1"
DP_UNSUPPORTED = (
    "data-parallel training (dp > 1) with model.backend=megatron is not implemented yet; "
    "run tp*pp = world size processes (e.g. parallel=tp2pp1 on 2 processes)"
)
ENTROPY_UNSUPPORTED = "algorithm.entropy_coef > 0 is not supported by model.backend=megatron yet"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


@POLICY_BACKENDS.register("megatron")
class MegatronPolicy(PPOUpdateMixin):
    """Trainable (actor) or frozen (reference) megatron ``GPTModel`` built from a local HF folder."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: NemoAzrConfig,
        *,
        trainable: bool = True,
        device: str | torch.device = "cpu",
    ) -> None:
        from megatron.core import parallel_state as ps

        self.cfg = cfg
        self.model_path = Path(model_path)
        self.device = torch.device(device)
        self.trainable = trainable
        if cfg.parallel.pipeline_model_parallel_size > 1:
            raise ConfigError(PP_UNSUPPORTED)
        if cfg.algorithm.entropy_coef > 0:
            raise ConfigError(ENTROPY_UNSUPPORTED)
        self.hf_config = AutoConfig.from_pretrained(str(self.model_path))
        self.layout = ParallelLayout.from_config(cfg.parallel)
        kv = getattr(self.hf_config, "num_key_value_heads", None) or 0
        # Under torchrun the process group may not exist yet: the launcher's WORLD_SIZE is the truth.
        world = _world() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
        resolved = validate_parallel(
            cfg,
            world_size=world,
            num_attention_heads=self.hf_config.num_attention_heads,
            num_key_value_heads=kv,
            num_layers=self.hf_config.num_hidden_layers,
        )
        if resolved.dp > 1:
            raise ConfigError(DP_UNSUPPORTED)
        # A frozen reference model shares the actor's groups: re-initialising would replace them.
        if trainable or not ps.model_parallel_is_initialized():
            initialize_parallel(self.layout, seed=cfg.seed, backend=resolved.backend)
        dtype = getattr(torch, cfg.model.dtype)
        self.model = build_gpt_model(self.hf_config, self.layout, dtype=dtype)
        load_hf_into_megatron(self.model, self.model_path, self.layout)
        self.temperature = cfg.generation.temperature
        self.chunk_size = cfg.model.logprob_chunk_size or auto_chunk_size(self.hf_config.vocab_size)
        self.kernel_backend = cfg.model.kernel_backend
        if trainable:
            self.model.train()
        else:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler = None
        self._hf_model: torch.nn.Module | None = None

    # --- optimisation set-up ----------------------------------------------------------------------
    def setup_optimizer(self, total_steps: int) -> None:
        # AdamW is elementwise, so each TP rank stepping its own shard equals stepping the full tensor.
        self.optimizer, self.scheduler = build_optimizer(
            self.model.parameters(), self.cfg.optim, total_steps=total_steps
        )

    # --- HF export (generation copy, checkpoints) -------------------------------------------------
    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-layout state dict on every rank (collective: all ranks must call it).

        With tied embeddings ``lm_head.weight`` is the embedding, as in a transformers state dict
        (so a strict ``load_state_dict`` of the generation copy accepts it).
        """
        full = gather_hf_state_dict(self.model, self.hf_config, self.layout)
        if full is not None and getattr(self.hf_config, "tie_word_embeddings", False):
            full.setdefault("lm_head.weight", full["model.embed_tokens.weight"])
        if _world() == 1:
            return full
        # Rank 0 holds the gathered dict; every rank refits its own generation copy, so broadcast
        # the key/shape list once (small) and then each tensor.
        meta = [[(k, tuple(v.shape), v.dtype) for k, v in full.items()] if _rank() == 0 else None]
        dist.broadcast_object_list(meta, src=0)
        out: dict[str, torch.Tensor] = {}
        for key, shape, dtype in meta[0]:
            t = full[key].contiguous() if _rank() == 0 else torch.empty(shape, dtype=dtype)
            dist.broadcast(t, src=0)
            out[key] = t
        return out

    def _hf_copy(self) -> torch.nn.Module:
        """A transformers model (local files only) holding the current weights."""
        if self._hf_model is None:
            self._hf_model = AutoModelForCausalLM.from_pretrained(
                str(self.model_path), dtype=getattr(torch, self.cfg.model.dtype), local_files_only=True
            )
        self._hf_model.load_state_dict(self.export_hf_state_dict())
        return self._hf_model

    def generation_model(self) -> torch.nn.Module:
        """HF model with the current weights for the generation backend (which copies it)."""
        return self._hf_copy()

    # --- log-probs -------------------------------------------------------------------------------
    def token_logprobs(self, batch: Batch, *, mask_key: str = F.LOSS_MASK) -> torch.Tensor:
        """logprobs[B, T] of ``input_ids`` at the columns where ``batch[mask_key]`` is 1 (0 elsewhere)."""
        lp = megatron_token_logprobs(
            self.model,
            batch[F.INPUT_IDS],
            batch[F.ATTENTION_MASK],
            batch.get(F.POSITION_IDS),
            temperature=self.temperature,
            chunk_size=self.chunk_size,
            backend=self.kernel_backend,
        )
        # megatron_token_logprobs fills every real token; the hf backend only the trained ones.
        return lp * (batch[mask_key].to(lp.device) > 0)

    # --- RL update: PPOUpdateMixin (models/ppo_update.py) ---------------------------------------
    def micro_objective(
        self, micro: Batch, *, num_tokens: float, num_seqs: int, norm_length: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics of one micro-batch (global normalisers given) via ``policy_objective``."""
        old = micro.get(F.OLD_LOGPROBS)
        logprobs = self.token_logprobs(micro)
        return policy_objective(
            logprobs=logprobs,
            old_logprobs=logprobs.detach() if old is None else old.to(logprobs.device),
            advantages=micro[F.ADVANTAGES].to(logprobs.device),
            loss_mask=micro[F.LOSS_MASK].to(logprobs.device),
            cfg=self.cfg.algorithm,
            ref_logprobs=micro.get(F.REF_LOGPROBS),
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length,
        )

    def _grad_norm(self) -> float:
        """Global L2 norm of the gradients: each TP shard once, replicated tensors (norms) once."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

        sq = torch.zeros((), dtype=torch.float64)
        for p in self.model.parameters():
            if p.grad is not None and param_is_not_tensor_parallel_duplicate(p):
                sq += p.grad.detach().double().pow(2).sum().cpu()
        if ps.get_tensor_model_parallel_world_size() > 1:
            dist.all_reduce(sq, group=ps.get_tensor_model_parallel_group())
        return float(sq.sqrt())

    def _clip(self, max_norm: float) -> float:
        norm = self._grad_norm()
        # Same coefficient as torch.nn.utils.clip_grad_norm_ (the hf backend).
        coef = max_norm / (norm + 1e-6)
        if math.isfinite(norm) and coef < 1.0:
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.mul_(coef)
        return norm

    def _clip_and_step(self) -> float:
        max_norm = self.cfg.optim.grad_clip if self.cfg.optim.grad_clip > 0 else float("inf")
        norm = self._clip(max_norm)
        if math.isfinite(norm):
            self.optimizer.step()
        # A non-finite gradient would poison the weights: drop it (counted by the caller).
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    # --- supervised warm-up ----------------------------------------------------------------------
    def sft_step(self, batch: Batch, optimizer: torch.optim.Optimizer) -> float:
        """One step of mean token NLL over ``loss_mask`` (supervised warm-up)."""
        optimizer.zero_grad(set_to_none=True)
        lp = self.token_logprobs(batch)
        mask = batch[F.LOSS_MASK].to(lp.device)
        loss = -(lp * mask).sum() / mask.sum().clamp(min=1)
        loss.backward()
        if self.cfg.optim.grad_clip > 0:
            self._clip(self.cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    # --- checkpoint ------------------------------------------------------------------------------
    def save(self, folder: Path, *, tokenizer: Any = None) -> None:
        """Rank 0 writes ``folder/model`` (HF format); every rank its ``optim_rank{r}.pt``. Collective."""
        hf = self._hf_copy()  # collective gather on every rank
        if _rank() == 0:
            hf.save_pretrained(folder / "model")
            if tokenizer is not None:
                tokenizer.save_pretrained(folder / "model")
        if self.optimizer is not None:
            torch.save(
                {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()},
                folder / f"optim_rank{_rank()}.pt",
            )
        if _world() > 1:  # the checkpoint is complete only once every rank has written
            dist.barrier()

    def load(self, folder: Path) -> None:
        model_dir = folder / "model"
        if not (model_dir / "model.safetensors").is_file():
            raise CheckpointError(f"{folder} has no model/model.safetensors")
        try:
            load_hf_into_megatron(self.model, model_dir, self.layout)
        except (RuntimeError, KeyError) as exc:
            raise CheckpointError(
                f"checkpoint {folder} does not fit this model (another model shape?): {str(exc).splitlines()[0]}"
            ) from None
        if self.optimizer is not None:
            optim_file = folder / f"optim_rank{_rank()}.pt"
            if not optim_file.is_file():
                raise CheckpointError(f"{folder} has no {optim_file.name} (saved with another layout?)")
            state = torch.load(optim_file, weights_only=False)
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
