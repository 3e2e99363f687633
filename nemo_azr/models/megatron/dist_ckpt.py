"""Megatron checkpoints with ``megatron.core.dist_checkpointing`` (torch_dist format) that reshard.

Every tensor is saved with its global key and its place in the global tensor (megatron's
``sharded_state_dict``: layer numbers are global, tensor-parallel axes recorded), so a checkpoint
written at one TP/PP/DP layout loads at any other. The optimizer (a torch AdamW) is saved the way
megatron's own non-distributed optimizer does it: ``exp_avg`` / ``exp_avg_sq`` are sharded exactly
like their parameters (``optimizer.state.<name>.<param key>``); the step counter, the param-group
hyper-parameters (the current LR among them) and the LR scheduler are small common objects.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_azr.errors import CheckpointError
from nemo_azr.models.megatron.distributed_optimizer import ShardedAdamW

__all__ = ["load_dist_checkpoint", "save_dist_checkpoint"]

_ADAM_STATES = ("exp_avg", "exp_avg_sq")


def _root_cause(exc: BaseException) -> str:
    """The innermost error line of ``exc``: torch's CheckpointException wraps each rank's traceback."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    causes = [line for line in lines if "Exception: " in line or "Error: " in line]
    text = causes[-1].split(": ", 1)[1] if causes else (lines[0] if lines else type(exc).__name__)
    return text[:300]


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _sharded_state_dict(
    chunks: list[torch.nn.Module],
    optimizer: torch.optim.Optimizer | ShardedAdamW | None,
    scheduler: Any,
    *,
    for_load: bool,
) -> dict[str, Any]:
    """The sharded state dict of the model chunks and (optionally) the optimizer and scheduler.

    ``for_load``: the optimizer tensors are zero placeholders of the right shape (a fresh optimizer
    has no state yet); loading fills them.
    """
    from megatron.core.dist_checkpointing.optimizer import (
        get_param_id_to_sharded_param_map,
        make_sharded_optimizer_tensor,
    )

    model_sd = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(chunks)}
    out: dict[str, Any] = {"model": model_sd}
    if optimizer is None:
        return out
    if isinstance(optimizer, ShardedAdamW):  # megatron's own format (param slices, reshardable)
        out["distributed_optimizer"] = optimizer.sharded_state_dict(model_sd, for_load=for_load)
        return out
    params = _params(optimizer)
    id_map = get_param_id_to_sharded_param_map(model_sd, params)
    state: dict[int, dict[str, Any]] = {}
    step = 0
    for i, p in enumerate(params):
        own = optimizer.state.get(p, {})
        step = max(step, int(own["step"])) if "step" in own else step
        state[i] = {
            name: make_sharded_optimizer_tensor(
                id_map[i],
                torch.zeros_like(p) if for_load or name not in own else own[name],
                prefix=f"optimizer.state.{name}",
            )
            for name in _ADAM_STATES
        }
    out["optimizer"] = {
        "state": state,
        # Every parameter steps together (data-parallel ranks zero-fill missing gradients).
        "step": step,
        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups],
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
    }
    return out


def save_dist_checkpoint(
    chunks: list[torch.nn.Module],
    optimizer: torch.optim.Optimizer | ShardedAdamW | None,
    scheduler: Any,
    folder: Path,
    *,
    async_queue: Any = None,
    on_written: Callable[[], None] | None = None,
) -> None:
    """Write this rank's shards into ``folder`` (collective: every rank calls it with the same path).

    With ``async_queue`` (megatron's ``AsyncCallsQueue``) the tensors are copied to host memory now
    and written by a background process; ``on_written`` runs on this rank once every rank's writes
    and megatron's metadata are done (``async_queue.maybe_finalize_async_calls``, collective).
    """
    from megatron.core import dist_checkpointing

    folder.mkdir(parents=True, exist_ok=True)
    if dist.get_world_size() > 1:
        dist.barrier()  # the folder exists for everyone before anyone writes
    state = _sharded_state_dict(chunks, optimizer, scheduler, for_load=False)
    if async_queue is None:
        dist_checkpointing.save(state, str(folder))
        if dist.get_world_size() > 1:
            dist.barrier()  # complete only once every rank has written
        if on_written is not None:
            on_written()
        return
    request = dist_checkpointing.save(state, str(folder), async_sharded_save=True)
    if on_written is not None:
        request.add_finalize_fn(on_written)
    async_queue.schedule_async_request(request)


def _check_optimizer_format(folder: Path, *, distributed: bool) -> None:
    """The optimizer state of ``folder`` must be in the format of this run's optimizer."""
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(str(folder))
    written = "distributed_optimizer" in common
    if written != distributed and ("optimizer" in common or written):
        raise CheckpointError(
            f"checkpoint {folder} was written with parallel.distributed_optimizer={str(written).lower()}: "
            "resume with the same setting (its weights alone load either way as model.path)"
        )


def load_dist_checkpoint(
    chunks: list[torch.nn.Module],
    optimizer: torch.optim.Optimizer | ShardedAdamW | None,
    scheduler: Any,
    folder: Path,
) -> None:
    """Load ``folder`` into this rank's chunks (and optimizer/scheduler) at the current layout."""
    from megatron.core import dist_checkpointing

    if not dist_checkpointing.check_is_distributed_checkpoint(str(folder)):
        raise CheckpointError(f"{folder} is not a megatron distributed checkpoint (no metadata.json)")
    if optimizer is not None:
        _check_optimizer_format(folder, distributed=isinstance(optimizer, ShardedAdamW))
    sharded = _sharded_state_dict(chunks, optimizer, scheduler, for_load=True)
    try:
        loaded = dist_checkpointing.load(sharded, str(folder))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - torch's CheckpointException derives from BaseException
        raise CheckpointError(
            f"checkpoint {folder} does not fit this model (another model shape?): {_root_cause(exc)}"
        ) from None
    for i, chunk in enumerate(chunks):
        missing, unexpected = chunk.load_state_dict(loaded["model"][f"model{i}"], strict=False)
        bad = [k for k in missing if not k.endswith("_extra_state")] + list(unexpected)
        if bad:
            raise CheckpointError(f"checkpoint {folder}: model keys do not match: {bad[:3]}")
    if optimizer is None:
        return
    if isinstance(optimizer, ShardedAdamW):
        optimizer.load_state_dict(loaded["distributed_optimizer"])
        return
    saved = loaded.get("optimizer")
    if saved is None:
        raise CheckpointError(f"checkpoint {folder} has no optimizer state")
    current = optimizer.state_dict()
    groups = [{**hp, "params": g["params"]} for hp, g in zip(saved["param_groups"], current["param_groups"])]
    state = {}
    if saved["step"] > 0:  # before the first step AdamW has no state
        for i, tensors in saved["state"].items():
            state[int(i)] = {"step": torch.tensor(float(saved["step"])), **tensors}
    optimizer.load_state_dict({"state": state, "param_groups": groups})
    if scheduler is not None and saved["scheduler"] is not None:
        scheduler.load_state_dict(saved["scheduler"])
