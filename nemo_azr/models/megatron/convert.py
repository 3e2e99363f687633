"""``nemo-azr convert``: HF <-> megatron (``dist_checkpointing``) checkpoints, in either direction.

``hf-to-megatron HF_DIR OUT``: OUT/dist (the model's sharded weights, torch_dist) and OUT/model (the HF
config and tokenizer, no weights): usable as ``model.path`` with ``model.backend=megatron``.
``megatron-to-hf CKPT OUT``: a trainer ``step_N`` checkpoint (or a converted folder) -> a HF folder.

Both build the model at the ``parallel`` layout of the given overrides (default one process): run
them under ``torchrun`` with ``parallel=tp2pp1`` etc. for models that do not fit one process. The
dist checkpoint itself is layout-free: it loads at any TP/PP/DP.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.distributed.parallel import global_rank
from nemo_azr.errors import CheckpointError

__all__ = ["copy_hf_side_files", "hf_to_megatron_checkpoint", "megatron_to_hf_checkpoint"]

#: Files of a HF folder that are weights (not copied next to a dist checkpoint).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def copy_hf_side_files(src: Path, dst: Path) -> None:
    """Config, generation config, tokenizer and chat template of ``src`` into ``dst`` (no weights)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES) and f.name not in _WEIGHT_INDEXES:
            shutil.copy2(f, dst / f.name)


def _barrier() -> None:
    """``dist.barrier()`` when several processes run (no-op for one, or without torch.distributed)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _check_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"output folder {out} exists and is not empty")


def _policy(model_path: Path, cfg: NemoAzrConfig):
    from nemo_azr.models.megatron.policy import MegatronPolicy

    return MegatronPolicy(model_path, cfg, trainable=False)


def hf_to_megatron_checkpoint(hf_dir: Path, out: Path, cfg: NemoAzrConfig) -> Path:
    """Write ``out/dist`` and ``out/model`` from a local HF Llama / Qwen2 folder. Collective: ``out`` is
    complete on every rank when it returns."""
    from nemo_azr.models.megatron.dist_ckpt import save_dist_checkpoint

    if not (hf_dir / "config.json").is_file():
        raise CheckpointError(f"{hf_dir} is not a HF model folder (config.json missing)")
    _check_out(out)
    policy = _policy(hf_dir, cfg)
    # Every rank has checked that OUT is empty before any rank creates OUT/dist (under torchrun a fast
    # rank would otherwise make a slow one's check fail).
    _barrier()
    save_dist_checkpoint(policy.chunks, None, None, out / "dist")
    if global_rank() == 0:
        copy_hf_side_files(hf_dir, out / "model")
    _barrier()  # OUT is complete on return, on every rank
    return out


def megatron_to_hf_checkpoint(ckpt: Path, out: Path, cfg: NemoAzrConfig) -> Path:
    """Write a HF folder (safetensors, config, tokenizer) from a megatron checkpoint. Collective."""
    from transformers import AutoModelForCausalLM

    if not (ckpt / "dist").is_dir():
        raise CheckpointError(f"{ckpt} is not a megatron checkpoint (no dist/ folder)")
    _check_out(out)
    policy = _policy(ckpt, cfg)
    state = policy.export_hf_state_dict()  # collective: every rank has checked OUT before rank 0 writes
    if global_rank() == 0:
        import torch

        model = AutoModelForCausalLM.from_config(policy.hf_config, dtype=getattr(torch, cfg.model.dtype))
        model.load_state_dict(state)
        copy_hf_side_files(ckpt / "model", out)
        model.save_pretrained(out)
    _barrier()
    return out
