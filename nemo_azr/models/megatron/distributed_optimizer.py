"""``parallel.distributed_optimizer=true``: megatron-core's DDP and distributed optimizer (ZeRO-1).

megatron's ``DistributedDataParallel`` keeps every gradient of a model chunk in one contiguous fp32
buffer (backward hooks add ``param.grad`` into ``param.main_grad``). ``finalize_model_grads``
reduce-scatters it over the data-parallel group, and also sums the tied embedding over the first and
last pipeline stages and the sequence-parallel norm weights over tensor-parallel ranks. Each
data-parallel rank then holds the summed gradient of its 1/dp slice of the parameters.

``DistributedOptimizer`` keeps the AdamW state (and fp32 master weights for bf16 models) of that
slice only, steps it, and all-gathers the updated parameters. Losses use global normalisers and the
model config has ``calculate_per_token_loss``, so gradients are summed, not averaged, over the
data-parallel ranks: one step equals the one-process step.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from nemo_azr.config.schema import OptimConfig
from nemo_azr.errors import ConfigError
from nemo_azr.models.training.optim import lr_schedule

__all__ = ["ShardedAdamW", "wrap_for_distributed_optimizer"]

#: The checkpoint format of the optimizer state: one flattened slice of each parameter's state per
#: rank under the parameter's global key, so it reshards over TP, PP and DP.
SHARDING_TYPE = "fully_reshardable"


def wrap_for_distributed_optimizer(chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
    """Wrap each model chunk in megatron's DDP with the distributed optimizer's gradient buffers.

    The chunks keep their parameters (now views into the DDP parameter buffer): forward passes may
    go through the wrapped or the bare chunk alike, the backward hooks sit on the parameters.
    """
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        use_distributed_optimizer=True,
        grad_reduce_in_fp32=True,
        # The update runs all micro-batches, then one reduce-scatter (no overlap with backward).
        overlap_grad_reduce=False,
        overlap_param_gather=False,
        # Sum over data-parallel ranks (the losses carry the global normalisers).
        average_in_collective=False,
        check_for_nan_in_grad=False,  # a non-finite norm skips the step instead (as on hf)
    )
    return [DistributedDataParallel(chunk.config, ddp_config, chunk) for chunk in chunks]


class ShardedAdamW:
    """AdamW with the LR schedule of ``optim``, sharded over data-parallel ranks by megatron.

    Offers what the update loop uses of a torch optimizer (``zero_grad``, ``param_groups``) plus
    :meth:`finish_gradients` and :meth:`clip_and_step`.
    """

    def __init__(
        self,
        ddp_chunks: list[torch.nn.Module],
        cfg: OptimConfig,
        *,
        total_steps: int,
        lr: float | None = None,
        weight_decay: float | None = None,
        schedule: bool = True,
    ) -> None:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        dtype = ddp_chunks[0].config.params_dtype
        self.ddp_chunks = ddp_chunks
        self.config = OptimizerConfig(
            optimizer="adam",
            lr=cfg.lr if lr is None else lr,
            weight_decay=cfg.weight_decay if weight_decay is None else weight_decay,
            adam_beta1=cfg.betas[0],
            adam_beta2=cfg.betas[1],
            adam_eps=cfg.eps,
            clip_grad=cfg.grad_clip,
            use_distributed_optimizer=True,
            bf16=dtype == torch.bfloat16,
            fp16=dtype == torch.float16,
            params_dtype=dtype,
        )
        # config_overrides={}: decay every parameter like torch AdamW on the hf backend (megatron's
        # default exempts biases and norm weights).
        self.optimizer = get_megatron_optimizer(
            self.config, ddp_chunks, config_overrides={}, use_gloo_process_groups=False
        )
        inner = self.optimizer.chained_optimizers
        if len(inner) != 1:  # expert-parallel (MoE) parameters get a second optimizer
            raise ConfigError(f"parallel.distributed_optimizer: expected one optimizer, got {len(inner)}")
        self.scheduler = lr_schedule(inner[0].optimizer, cfg, total_steps=total_steps) if schedule else None

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for chunk in self.ddp_chunks:
            chunk.zero_grad_buffer()
        with warnings.catch_warnings():
            # megatron clears `.grad` of its shard views too (harmless; torch warns once per run).
            warnings.filterwarnings("ignore", message="The .grad attribute of a Tensor that is not a leaf")
            self.optimizer.zero_grad(set_to_none)

    def finish_gradients(self) -> None:
        """Collective: reduce-scatter the gradient buffers (and the tied-embedding / sequence-parallel
        sums) once every micro-batch of the step has run its backward."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads(self.ddp_chunks)

    def clip_and_step(self) -> float:
        """Clip to ``optim.grad_clip`` and step; a non-finite norm skips the step. Returns the norm."""
        self.optimizer.prepare_grads()
        norm = float(self.optimizer.get_grad_norm())
        if math.isfinite(norm):
            self.optimizer.step()  # clips by the same norm, steps, all-gathers the parameters
        self.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        return norm

    # --- checkpoint ------------------------------------------------------------------------------
    def sharded_state_dict(self, model_sharded_state_dict: dict, *, for_load: bool) -> dict[str, Any]:
        self._ensure_adam_state()
        return {
            "sharded": self.optimizer.sharded_state_dict(
                model_sharded_state_dict,
                is_loading=for_load,
                metadata={"distrib_optim_sharding_type": SHARDING_TYPE},
            ),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def _ensure_adam_state(self) -> None:
        """Give every shard torch AdamW's initial state (step 0, zero moments) if it has none yet.

        With torch's AdamW (no TE / apex fused Adam) megatron's ``DistributedOptimizer.state_dict``
        reads the step from each parameter's state, so a checkpoint written before the first step,
        or loaded into a fresh optimizer, would fail; torch's first step finds the same values.
        """
        from megatron.core.optimizer.distrib_optimizer import HAVE_APEX_OR_TE

        if HAVE_APEX_OR_TE:  # fused Adam keeps the step in the param groups
            return
        for opt in self.optimizer.chained_optimizers:
            for group in opt.optimizer.param_groups:
                for p in group["params"]:
                    state = opt.optimizer.state[p]
                    if not state:
                        state["step"] = torch.tensor(0.0)
                        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _keep_torch_adam_step_out_of_param_state_load()
        self.optimizer.load_state_dict(state["sharded"])
        # megatron gives every parameter's state one shared step tensor, which torch's AdamW then
        # increments in place once per parameter: give each its own.
        for opt in self.optimizer.chained_optimizers:
            for param_state in opt.optimizer.state.values():
                if torch.is_tensor(param_state.get("step")):
                    param_state["step"] = param_state["step"].clone()
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])


def _keep_torch_adam_step_out_of_param_state_load() -> None:
    """Work around megatron-core 0.16 loading a reshardable checkpoint into torch's AdamW.

    Without TE / apex fused Adam, ``DistributedOptimizer.load_state_dict`` first puts the step into
    every parameter's state, then ``_set_main_param_and_optimizer_states`` copies each key of that
    state from the checkpoint's per-parameter tensors, which carry no ``step`` (KeyError). Hide the
    step during that copy. Applied once; a no-op with fused Adam (the step lives in param groups).
    """
    from megatron.core.optimizer import distrib_optimizer as mdo

    cls = mdo.DistributedOptimizer
    if mdo.HAVE_APEX_OR_TE or getattr(cls, "_step_kept_out", False):
        return
    original = cls._set_main_param_and_optimizer_states

    def set_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        step = state.pop("step", None)
        try:
            original(self, model_param, tensors)
        finally:
            if step is not None:
                state["step"] = step

    cls._set_main_param_and_optimizer_states = set_states
    cls._step_kept_out = True
