"""``megatron`` policy backend: a megatron-core ``GPTModel`` (tensor/pipeline/data parallel) trained like ``hf``.

Same interface and maths as :class:`nemo_azr.models.hf.policy.HFPolicy` (the non-fused path): the loss
is ``policy_objective`` on the log-probs of :func:`megatron_token_logprobs`, with the same global
normalisers, micro-batch accumulation, AdamW + LR schedule and grad clipping (over the whole model:
the norm sums each tensor/pipeline shard once).

Every rank runs the same rollout, with its own HF generation copy (``generation_model`` /
``export_hf_state_dict``) or, with ``generation.backend=megatron``, from its own shards in place, so
the whole batch is on every rank and no data is broadcast. Each
mini-batch's rows are then split over the data-parallel ranks (strided, so each gets a similar mix);
the losses keep the mini-batch's global normalisers, so summing the gradients over the
data-parallel group (one all-reduce) gives exactly the one-process gradient. With pipeline
parallelism a rank's rows go through megatron's schedule (1F1B / interleaved) in
``parallel.micro_batch_size``-row micro-batches; the last stage computes the loss.

With ``algorithm.max_tokens_per_microbatch > 0`` each rank groups its rows by that token budget
instead (``models/training/microbatch.py``; the cost of a micro-batch is rows x its longest row, which is what
megatron runs after moving each row's real tokens to the front), on one stage and through the
pipeline schedule (micro-batches of varying shapes: ``logprobs.run_pipeline``). Data-parallel ranks
may then run different numbers of micro-batches: the only data-parallel collectives (gradient
all-reduce / reduce-scatter, metrics) come after a rank's last micro-batch.

With ``parallel.distributed_optimizer`` the chunks are wrapped in megatron's DDP and stepped by its
``DistributedOptimizer`` (``distributed_optimizer.py``): gradients land in DDP's buffers and are
reduce-scattered, each data-parallel rank steps its slice of the AdamW state.

Checkpoints: ``dist/`` (megatron ``dist_checkpointing``, torch_dist: model and optimizer state with
their sharding, so they load at another TP/PP/DP layout) and ``model/`` (the HF export, rank 0).
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_azr.algorithms.objective import policy_objective
from nemo_azr.config.parallel_validate import validate_parallel
from nemo_azr.config.schema import NemoAzrConfig, OptimConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.distributed.collectives import (
    broadcast_metric_dict,
    broadcast_state_dict,
    gather_metric_dicts,
    gather_strided_rows,
)
from nemo_azr.distributed.parallel import ParallelLayout, global_rank, initialize_parallel, world_size
from nemo_azr.errors import CheckpointError
from nemo_azr.models.hf.policy import auto_chunk_size
from nemo_azr.models.megatron.builder import build_gpt_model
from nemo_azr.models.megatron.dist_ckpt import load_dist_checkpoint, save_dist_checkpoint
from nemo_azr.models.megatron.distributed_optimizer import ShardedAdamW, wrap_for_distributed_optimizer
from nemo_azr.models.megatron.grads import (
    all_reduce_data_parallel_grads,
    all_reduce_sequence_parallel_grads,
    all_reduce_tied_embedding_grads,
    model_grad_norm,
)
from nemo_azr.models.megatron.hf_adapter import gather_hf_state_dict, load_hf_into_megatron
from nemo_azr.models.megatron.logprobs import (
    CompactBatch,
    compact_rows,
    megatron_token_logprobs,
    pad_columns,
    pipeline_micro_batches,
    run_pipeline,
)
from nemo_azr.models.megatron.preference import MegatronPreferenceMixin
from nemo_azr.models.training.microbatch import real_lengths, row_groups
from nemo_azr.models.training.optim import build_optimizer
from nemo_azr.models.training.ppo_update import (
    PPOUpdateMixin,
    add_micro_metrics,
    in_loss_rollout_logprobs,
    merge_rank_metrics,
    micro_metric,
)
from nemo_azr.registry import POLICY_BACKENDS

__all__ = ["MegatronPolicy"]


def megatron_source(path: Path) -> tuple[Path, Path | None]:
    """(folder with the HF config, dist checkpoint folder or None) of a ``model.path``: a HF model
    folder, or a megatron checkpoint (a trainer ``step_N`` folder or ``nemo-azr convert`` output)."""
    if (path / "dist").is_dir():
        if not (path / "model" / "config.json").is_file():
            raise CheckpointError(f"{path} has dist/ but no model/config.json (the HF config of the model)")
        return path / "model", path / "dist"
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"{path} is neither a HF model folder (config.json) nor a megatron checkpoint (dist/)"
        )
    return path, None


#: ``loss_fn(micro, logprobs, entropy)`` of :meth:`MegatronPolicy.backward_rows`: a micro-batch of the
#: contract, its differentiable log-probs ``[b, T]`` (loss-masked) and, when asked for, the entropies
#: in the same columns (else None) -> (scalar loss, metrics).
MicroLossFn = Callable[[Batch, torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, dict[str, float]]]


@POLICY_BACKENDS.register("megatron")
class MegatronPolicy(MegatronPreferenceMixin, PPOUpdateMixin):
    """Trainable (actor) or frozen (reference) megatron ``GPTModel`` built from a local HF folder."""

    def __init__(
        self,
        model_path: str | Path,
        cfg: NemoAzrConfig,
        *,
        trainable: bool = True,
        device: str | torch.device = "cpu",
        share_parallel_groups: bool = False,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.cfg = cfg
        self.optim_cfg = self._optim_config()
        self.model_path = Path(model_path)
        self.device = torch.device(device)
        self.trainable = trainable
        # model.path: a HF folder, or a megatron checkpoint (dist/ + model/ with the HF config).
        self.config_dir, dist_dir = megatron_source(self.model_path)
        self.hf_config = AutoConfig.from_pretrained(str(self.config_dir))
        self.layout = ParallelLayout.from_config(cfg.parallel)
        kv = getattr(self.hf_config, "num_key_value_heads", None) or 0
        # Under torchrun the process group may not exist yet: the launcher's WORLD_SIZE is the truth.
        world = world_size() if dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))
        self.resolved = validate_parallel(
            cfg,
            world_size=world,
            num_attention_heads=self.hf_config.num_attention_heads,
            num_key_value_heads=kv,
            num_layers=self.hf_config.num_hidden_layers,
        )
        # A frozen reference model (and a critic) shares the actor's groups: re-initialising would
        # replace them.
        share = share_parallel_groups or not trainable
        if not share or not ps.model_parallel_is_initialized():
            initialize_parallel(
                self.layout, seed=cfg.seed, backend=self.resolved.backend, timeout_s=cfg.parallel.timeout_s
            )
        dtype = getattr(torch, cfg.model.dtype)
        # One model chunk per virtual pipeline stage (interleaved schedule), else one.
        self.chunks = [
            build_gpt_model(self.hf_config, self.layout, dtype=dtype, vp_stage=v if self.layout.vpp else None)
            for v in range(max(1, self.layout.vpp))
        ]
        self.model = torch.nn.ModuleList(self.chunks)  # parameters / train() / eval() of all chunks
        if dist_dir is None:
            load_hf_into_megatron(self.chunks, self.model_path, self.layout)
        else:
            load_dist_checkpoint(self.chunks, None, None, dist_dir)
        self.temperature = cfg.generation.temperature
        self.micro_batch_size = self.resolved.micro_batch_size
        self.chunk_size = cfg.model.logprob_chunk_size or auto_chunk_size(self.hf_config.vocab_size)
        self.kernel_backend = cfg.model.kernel_backend
        self._attach_heads()
        if trainable:
            self.model.train()
        else:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        # parallel.distributed_optimizer: megatron's DDP (gradient buffers) around the chunks.
        self.ddp_chunks = (
            wrap_for_distributed_optimizer(self.chunks)
            if trainable and cfg.parallel.distributed_optimizer
            else None
        )
        self.optimizer: torch.optim.Optimizer | ShardedAdamW | None = None
        self.scheduler = None
        self._hf_model: torch.nn.Module | None = None
        self._async_queue = None  # megatron AsyncCallsQueue of trainer.async_save

    def _optim_config(self) -> OptimConfig:
        """The optimizer settings of this model (a critic has its own)."""
        return self.cfg.optim

    def _attach_heads(self) -> None:
        """Add modules to the chunks after the weights are loaded and before any DDP wrapping (a
        critic's value head); the policy has none."""

    #: What the last stage computes in the pipelined update (None: log-probs; a critic: its values).
    pipeline_head = None

    def _loss_inputs(
        self, batch: Batch, columns: list[torch.Tensor], entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pipelined update's per-column outputs ``[b, T]`` -> the loss function's inputs."""
        return columns[0], (columns[1] if entropy else None)

    # --- layout helpers --------------------------------------------------------------------------
    @property
    def _pipelined(self) -> bool:
        return self.layout.pp > 1

    def _dp(self) -> tuple[int, int]:
        from megatron.core import parallel_state as ps

        return ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()

    def _my_rows(self, rows: int) -> torch.Tensor:
        """This data-parallel rank's rows of a ``rows``-row batch (strided)."""
        rank, size = self._dp()
        return torch.arange(rank, rows, size)

    def micro_batch_rows(self) -> int:
        """Rows per micro-batch without a token budget: ``parallel.micro_batch_size`` (resolved)."""
        return self.micro_batch_size

    @property
    def _max_tokens(self) -> int:
        return self.cfg.algorithm.max_tokens_per_microbatch

    # --- optimisation set-up ----------------------------------------------------------------------
    def setup_optimizer(self, total_steps: int) -> None:
        if self.ddp_chunks is not None:  # each data-parallel rank keeps 1/dp of the AdamW state
            self.optimizer = ShardedAdamW(self.ddp_chunks, self.optim_cfg, total_steps=total_steps)
            self.scheduler = self.optimizer.scheduler
            return
        # AdamW is elementwise, so each TP/PP rank stepping its own shard equals stepping the full
        # tensor; data-parallel replicas step identical (all-reduced) gradients.
        self.optimizer, self.scheduler = build_optimizer(
            self.model.parameters(), self.optim_cfg, total_steps=total_steps
        )

    # --- HF export (generation copy, checkpoints) -------------------------------------------------
    def export_hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The full HF-layout state dict on every rank (collective: all ranks must call it).

        With tied embeddings ``lm_head.weight`` is the embedding, as in a transformers state dict
        (so a strict ``load_state_dict`` of the generation copy accepts it).
        """
        full = gather_hf_state_dict(self.chunks, self.hf_config, self.layout)
        if full is not None and getattr(self.hf_config, "tie_word_embeddings", False):
            full.setdefault("lm_head.weight", full["model.embed_tokens.weight"])
        if world_size() == 1:
            return full
        # Rank 0 holds the gathered dict; every rank refits its own generation copy.
        return broadcast_state_dict(full if global_rank() == 0 else None, src=0)

    def _hf_copy(self) -> torch.nn.Module:
        """A transformers model (local files only) holding the current weights."""
        if self._hf_model is None:  # built from the config: its weights come from the export
            self._hf_model = AutoModelForCausalLM.from_config(
                self.hf_config, dtype=getattr(torch, self.cfg.model.dtype)
            )
        self._hf_model.load_state_dict(self.export_hf_state_dict())
        return self._hf_model

    def generation_model(self) -> torch.nn.Module:
        """HF model with the current weights for the generation backend (which copies it)."""
        return self._hf_copy()

    def decoder_config(self):
        """The HF config the megatron model was built from (sizes for the no-grad token budget)."""
        return self.hf_config

    # --- log-probs -------------------------------------------------------------------------------
    def token_logprobs(
        self, batch: Batch, *, mask_key: str = F.LOSS_MASK, return_entropy: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """logprobs[B, T] of ``input_ids`` at the columns where ``batch[mask_key]`` is 1 (0 elsewhere);
        with ``return_entropy`` (one pipeline stage) also the entropies of the same columns.

        Differentiable without pipeline parallelism; with it a no-grad forward through the schedule.
        """
        return megatron_token_logprobs(
            self.chunks,
            batch[F.INPUT_IDS],
            batch[F.ATTENTION_MASK],
            batch.get(F.POSITION_IDS),
            temperature=self.temperature,
            chunk_size=self.chunk_size,
            backend=self.kernel_backend,
            micro_batch_size=self.micro_batch_size,
            max_tokens=self._max_tokens,
            return_entropy=return_entropy,
            # Only the trained columns go through the output head and the kernel (as on hf):
            # prompt tokens would add about a third of the head's work on RL rows for nothing.
            target_mask=batch[mask_key],
        )

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """No-grad log-probs[B, T] (old / reference): each data-parallel rank computes its rows,
        then one all-gather puts the whole batch on every rank."""
        was_training = self.model.training
        self.model.eval()
        rows = self._my_rows(len(batch))
        mine = batch.index(rows)
        if self._pipelined:  # the schedule micro-batches itself (and pipelines the micro-batches)
            local = self.token_logprobs(mine) if len(mine) else torch.zeros(0, batch.seq_len)
        else:  # by rows or by the token budget (PPOUpdateMixin.micro_batches)
            local = self.no_grad_pass(mine, self.token_logprobs)
        self.model.train(was_training)
        local = local.float().cpu()
        _, dp = self._dp()
        if dp == 1:
            return local
        from megatron.core import parallel_state as ps

        # Strided rows: rank r holds rows r, r+dp, ...
        return gather_strided_rows(local, len(batch), dp, ps.get_data_parallel_group())

    # --- gradients of a mini-batch -----------------------------------------------------------------
    def backward_rows(
        self,
        mb: Batch,
        loss_fn: MicroLossFn,
        optimizer: torch.optim.Optimizer | ShardedAdamW,
        *,
        entropy: bool = False,
    ) -> dict[str, float]:
        """Accumulate the gradients of ``loss_fn`` over this data-parallel rank's rows of ``mb``
        (micro-batched, pipelined when pp > 1), then sum them over the data-parallel group.

        ``loss_fn`` must normalise by mini-batch totals, so the summed gradient equals one process
        running all rows. Returns the summed micro-batch metrics, identical on every rank.
        ``optimizer`` decides where the gradients go: ``.grad`` (torch) or megatron's DDP buffers;
        ``entropy``: whether ``loss_fn`` gets the entropies (else None).
        """
        from megatron.core import parallel_state as ps

        mine = mb.index(self._my_rows(len(mb)))
        metrics: dict[str, float] = defaultdict(float)
        if len(mine) and not self._pipelined:
            for micro in (m.batch for m in self.micro_batches(mine)):
                out = self.token_logprobs(micro, return_entropy=entropy)
                loss, m = loss_fn(micro, *(out if entropy else (out, None)))
                loss.backward()
                add_micro_metrics(metrics, loss, m, weight=1.0, prefix=self.metric_prefix)
        elif len(mine):
            metrics = self._backward_pipelined(mine, loss_fn, entropy)
        _, dp = self._dp()
        if isinstance(optimizer, ShardedAdamW):
            optimizer.finish_gradients()  # megatron: reduce-scatter, tied embedding, SP norms
        else:
            if self._pipelined:
                all_reduce_tied_embedding_grads(self.chunks)
            if self.layout.sequence_parallel:
                all_reduce_sequence_parallel_grads(self.model.parameters())
            if dp > 1:
                all_reduce_data_parallel_grads(self.model.parameters(), ps.get_data_parallel_group())
        if dp > 1:
            metrics = merge_rank_metrics(gather_metric_dicts(metrics, dp, ps.get_data_parallel_group()))
        return dict(metrics)

    def _backward_pipelined(self, rows: Batch, loss_fn: MicroLossFn, entropy: bool) -> dict[str, float]:
        """Forward/backward of ``rows`` through megatron's pipeline schedule; metrics on every stage."""
        from megatron.core import parallel_state as ps

        compact = compact_rows(
            rows[F.INPUT_IDS], rows[F.ATTENTION_MASK], rows.get(F.POSITION_IDS), target_mask=rows[F.LOSS_MASK]
        )
        multiple = self.layout.tp if self.layout.sequence_parallel else 1  # even sequence split
        compact = pad_columns(compact, multiple)
        groups = row_groups(
            real_lengths(rows).tolist(), rows=self.micro_batch_size, max_tokens=self._max_tokens
        )
        # Fixed rows: every micro-batch has micro_batch_size rows (one p2p shape); token budget: each
        # has its own rows and width.
        compacts = pipeline_micro_batches(compact, groups, trim=self._max_tokens > 0, multiple=multiple)
        micros = [rows.index(g) for g in groups]
        width = rows.seq_len

        def pipeline_loss(index: int, micro: CompactBatch, values: torch.Tensor):
            batch = micros[index]
            # the compacted targets are the trained columns (target_mask): 0 everywhere else
            per_column = [micro.restore(v)[: len(batch), :width] for v in values.view(-1, values.shape[-1])]
            loss, m = loss_fn(batch, *self._loss_inputs(batch, per_column, entropy))
            return loss, {"loss": float(loss.detach()), **{k: float(v) for k, v in m.items()}}

        outputs = run_pipeline(
            self.chunks,
            compacts,
            pipeline_loss,
            forward_only=False,
            temperature=self.temperature,
            chunk_size=self.chunk_size,
            backend=self.kernel_backend,
            return_entropy=entropy,
            head=self.pipeline_head,
        )
        metrics: dict[str, float] = defaultdict(float)
        for out in outputs:
            loss = torch.tensor(out.pop("loss"))
            add_micro_metrics(metrics, loss, out, weight=1.0, prefix=self.metric_prefix)
        return broadcast_metric_dict(
            metrics,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )

    # --- RL update: PPOUpdateMixin (models/training/ppo_update.py) ---------------------------------------
    def accumulate_gradients(self, mb: Batch, *, num_tokens: float, norm_length: int) -> dict[str, float]:
        def objective(
            micro: Batch, logprobs: torch.Tensor, entropy: torch.Tensor | None
        ) -> tuple[torch.Tensor, dict[str, float]]:
            loss, m = self._objective(
                micro, logprobs, entropy, num_tokens=num_tokens, num_seqs=len(mb), norm_length=norm_length
            )
            # Token-weighted metrics: weigh by this micro-batch's share of the mini-batch's tokens.
            weight = float(micro[F.LOSS_MASK].sum()) / num_tokens
            return loss, {k: micro_metric(k, v, weight) for k, v in m.items()}

        # The entropy bonus needs the entropies (vocab-parallel, like the log-probs).
        return self.backward_rows(mb, objective, self.optimizer, entropy=self.cfg.algorithm.entropy_coef > 0)

    def _objective(
        self,
        micro: Batch,
        logprobs: torch.Tensor,
        entropy: torch.Tensor | None,
        *,
        num_tokens: float,
        num_seqs: int,
        norm_length: int,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        old = micro.get(F.OLD_LOGPROBS)
        rollout = in_loss_rollout_logprobs(
            micro, old, self.cfg.algorithm.off_policy_correction, logprobs.device
        )
        return policy_objective(
            logprobs=logprobs,
            old_logprobs=logprobs.detach() if old is None else old.to(logprobs.device),
            advantages=micro[F.ADVANTAGES].to(logprobs.device),
            loss_mask=micro[F.LOSS_MASK].to(logprobs.device),
            cfg=self.cfg.algorithm,
            ref_logprobs=micro.get(F.REF_LOGPROBS),
            entropy=entropy,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            norm_length=norm_length,
            rollout_logprobs=rollout,
            kl_weight=micro.get(F.KL_WEIGHT),
        )

    def _grad_norm(self) -> float:
        return model_grad_norm(self.model.parameters())

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
        if isinstance(self.optimizer, ShardedAdamW):
            return self.optimizer.clip_and_step()
        max_norm = self.optim_cfg.grad_clip if self.optim_cfg.grad_clip > 0 else float("inf")
        norm = self._clip(max_norm)
        if math.isfinite(norm):
            self.optimizer.step()
        # A non-finite gradient would poison the weights: drop it (counted by the caller).
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return norm

    # --- supervised warm-up ----------------------------------------------------------------------
    def sft_optimizer(self, lr: float) -> torch.optim.Optimizer | ShardedAdamW:
        """The supervised warm-up's optimizer: torch's AdamW defaults at ``lr`` (sharded like the RL
        optimizer with ``parallel.distributed_optimizer``; clipping at ``optim.grad_clip``)."""
        if self.ddp_chunks is None:
            return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=lr)
        return ShardedAdamW(
            self.ddp_chunks,
            OptimConfig(lr=lr, weight_decay=0.01, grad_clip=self.cfg.optim.grad_clip),
            total_steps=0,
            schedule=False,
        )

    def sft_step(self, batch: Batch, optimizer: torch.optim.Optimizer | ShardedAdamW) -> float:
        """One step of mean token NLL over ``loss_mask`` (supervised warm-up)."""
        optimizer.zero_grad(set_to_none=True)
        total = float(batch[F.LOSS_MASK].sum()) or 1.0

        def nll(
            micro: Batch, logprobs: torch.Tensor, _entropy: None
        ) -> tuple[torch.Tensor, dict[str, float]]:
            mask = micro[F.LOSS_MASK].to(logprobs.device)
            return -(logprobs * mask).sum() / total, {}

        metrics = self.backward_rows(batch, nll, optimizer)
        if isinstance(optimizer, ShardedAdamW):
            optimizer.clip_and_step()
            return metrics.get("actor/loss", 0.0)
        if self.cfg.optim.grad_clip > 0:
            self._clip(self.cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return metrics.get("actor/loss", 0.0)

    # --- checkpoint ------------------------------------------------------------------------------
    def save(
        self, folder: Path, *, tokenizer: Any = None, on_written: Callable[[], None] | None = None
    ) -> None:
        """Collective. ``dist/``: every rank's shards (dist_checkpointing); ``model/``: rank 0's HF
        export (weights when ``trainer.save_hf_weights``, else config and tokenizer only).

        With ``trainer.async_save`` the shards are written in the background and ``on_written`` runs
        from :meth:`finalize_saves` once all ranks are done; otherwise it runs before this returns.
        """
        if self.cfg.trainer.save_hf_weights:
            hf = self._hf_copy()  # collective gather on every rank
            if global_rank() == 0:
                hf.save_pretrained(folder / "model")
        elif global_rank() == 0:
            self.hf_config.save_pretrained(folder / "model")
        if tokenizer is not None and global_rank() == 0:
            tokenizer.save_pretrained(folder / "model")
        queue = None
        if self.cfg.trainer.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            # Non-persistent: one forked writer per save (megatron's persistent worker needs CUDA).
            self._async_queue = self._async_queue or AsyncCallsQueue(persistent=False)
            queue = self._async_queue
        save_dist_checkpoint(
            self.chunks,
            self.optimizer,
            self.scheduler,
            folder / "dist",
            async_queue=queue,
            on_written=on_written,
        )

    def finalize_saves(self, *, blocking: bool) -> None:
        """Finish background saves whose writes are done (all of them with ``blocking``). Collective."""
        if self._async_queue is not None:
            self._async_queue.maybe_finalize_async_calls(blocking=blocking)

    def load(self, folder: Path) -> None:
        if not (folder / "dist").is_dir():
            raise CheckpointError(
                f"{folder} has no dist/ (megatron checkpoint); to start from HF weights use model.path"
            )
        load_dist_checkpoint(self.chunks, self.optimizer, self.scheduler, folder / "dist")
