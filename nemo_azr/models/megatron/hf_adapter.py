"""HF Llama / Qwen2 state dict <-> the shards of the megatron ``GPTModel`` from :mod:`.builder`.

Per rank ``(tp_rank, pp_rank[, vp_stage])`` the megatron model holds:

* ``embedding.word_embeddings.weight`` (first stage) and ``output_layer.weight`` (last stage, unless
  the embeddings are tied and it is also the first stage): the vocabulary padded with zero rows to
  :func:`~nemo_azr.models.megatron.builder.padded_vocab_size`, split evenly on dim 0 (vocab parallel).
* per decoder layer (numbered locally from 0 on each stage):
  ``self_attention.linear_qkv`` = for each query group ``[its q heads; k head; v head]`` (weight and
  Qwen2 bias), split evenly on dim 0; when tp exceeds the kv heads megatron splits this same
  interleaved tensor and all-gathers it, so the rule is the same. ``mlp.linear_fc1`` = ``[gate; up]``
  of this rank's column shard. ``linear_proj`` (o_proj) and ``linear_fc2`` (down_proj) are row
  parallel: split on dim 1. Norm weights are replicated; with the local spec they are
  ``input_layernorm`` / ``pre_mlp_layernorm``, with TransformerEngine's spec (``fused_norms``) they
  are ``linear_qkv.layer_norm_weight`` / ``linear_fc1.layer_norm_weight``.
* ``decoder.final_layernorm.weight`` (last stage).

:func:`hf_to_megatron` builds one rank's shard; :func:`megatron_to_hf` inverts it exactly (bit for bit).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from nemo_azr.distributed.parallel import ParallelLayout
from nemo_azr.errors import CheckpointError
from nemo_azr.models.megatron.builder import check_layout_fits, padded_vocab_size, stage_layer_range

__all__ = [
    "gather_hf_state_dict",
    "hf_to_megatron",
    "load_hf_into_megatron",
    "megatron_stage_to_hf",
    "megatron_to_hf",
]

StateDict = dict[str, torch.Tensor]

_EMBED, _LM_HEAD, _NORM = "model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"
_M_EMBED, _M_OUT, _M_NORM = (
    "embedding.word_embeddings.weight",
    "output_layer.weight",
    "decoder.final_layernorm.weight",
)


def _layout(tp_size: int, pp_size: int, vp_size: int | None, divisible_by: int) -> ParallelLayout:
    return ParallelLayout(tp=tp_size, pp=pp_size, vpp=vp_size or 0, make_vocab_size_divisible_by=divisible_by)


def _geometry(hf_config: Any) -> tuple[int, int, int]:
    """(query heads, kv heads, head dim)."""
    heads = hf_config.num_attention_heads
    kv = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    return heads, kv, head_dim


def _norm_names(fused_norms: bool) -> tuple[str, str]:
    if fused_norms:  # TransformerEngine spec: the norms live inside the following linear layer
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    return "input_layernorm.weight", "pre_mlp_layernorm.weight"


def _is_first(pp_rank: int, vp_stage: int | None) -> bool:
    return pp_rank == 0 and not vp_stage


def _is_last(pp_rank: int, pp_size: int, vp_stage: int | None, vp_size: int | None) -> bool:
    return pp_rank == pp_size - 1 and (vp_stage or 0) == max(vp_size or 1, 1) - 1


def _vocab_shard(weight: torch.Tensor, padded: int, tp_rank: int, tp_size: int) -> torch.Tensor:
    full = torch.cat([weight, weight.new_zeros(padded - weight.shape[0], *weight.shape[1:])])
    return full.chunk(tp_size)[tp_rank].clone()


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: int) -> torch.Tensor:
    """``[q; k; v]`` (HF, head-major) -> megatron's per-group ``[q heads of group; k; v]``."""
    rest = q.shape[1:]
    grouped = [q.reshape(kv, -1, *rest), k.reshape(kv, -1, *rest), v.reshape(kv, -1, *rest)]
    return torch.cat(grouped, dim=1).reshape(-1, *rest)


def _split_qkv(fused: torch.Tensor, heads: int, kv: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    rest = fused.shape[1:]
    per_group = fused.reshape(kv, (heads // kv + 2) * head_dim, *rest)
    q_rows = heads // kv * head_dim
    q, k, v = per_group.split([q_rows, head_dim, head_dim], dim=1)
    return tuple(t.reshape(-1, *rest).clone() for t in (q, k, v))


def hf_to_megatron(
    hf_state_dict: Mapping[str, torch.Tensor],
    hf_config: Any,
    *,
    tp_rank: int,
    tp_size: int,
    pp_rank: int,
    pp_size: int,
    vp_stage: int | None = None,
    vp_size: int | None = None,
    make_vocab_size_divisible_by: int = 128,
    fused_norms: bool = False,
) -> StateDict:
    """The state dict of rank ``(tp_rank, pp_rank[, vp_stage])`` of the model built by ``build_gpt_model``.

    Reads only the HF keys this rank needs (``hf_state_dict`` may be a lazy mapping). Layer keys are
    numbered locally on the stage; ``_extra_state`` entries are not included.
    """
    layout = _layout(tp_size, pp_size, vp_size, make_vocab_size_divisible_by)
    check_layout_fits(hf_config, layout)
    heads, kv, head_dim = _geometry(hf_config)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    padded = padded_vocab_size(hf_config.vocab_size, layout)
    first, last = _is_first(pp_rank, vp_stage), _is_last(pp_rank, pp_size, vp_stage, vp_size)
    out: StateDict = {}

    def col(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=0)[tp_rank].clone()

    def row(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_size, dim=1)[tp_rank].contiguous().clone()

    if first:
        out[_M_EMBED] = _vocab_shard(hf_state_dict[_EMBED], padded, tp_rank, tp_size)
    if last:
        out[_M_NORM] = hf_state_dict[_NORM].clone()
        if not tied:
            out[_M_OUT] = _vocab_shard(hf_state_dict[_LM_HEAD], padded, tp_rank, tp_size)
        elif not first:  # tied, on another stage than the embedding: megatron keeps a copy here
            out[_M_OUT] = _vocab_shard(hf_state_dict[_EMBED], padded, tp_rank, tp_size)
    in_norm, mlp_norm = _norm_names(fused_norms)
    for local, layer in enumerate(stage_layer_range(hf_config.num_hidden_layers, layout, pp_rank, vp_stage)):
        src, dst = f"model.layers.{layer}.", f"decoder.layers.{local}."
        attn = src + "self_attn."
        out[dst + in_norm] = hf_state_dict[src + "input_layernorm.weight"].clone()
        out[dst + mlp_norm] = hf_state_dict[src + "post_attention_layernorm.weight"].clone()
        for suffix in ("weight", "bias"):
            if f"{attn}q_proj.{suffix}" in hf_state_dict:
                qkv = [hf_state_dict[f"{attn}{p}_proj.{suffix}"] for p in "qkv"]
                out[f"{dst}self_attention.linear_qkv.{suffix}"] = col(_fuse_qkv(*qkv, kv))
        out[dst + "self_attention.linear_proj.weight"] = row(hf_state_dict[attn + "o_proj.weight"])
        gate, up = hf_state_dict[src + "mlp.gate_proj.weight"], hf_state_dict[src + "mlp.up_proj.weight"]
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([col(gate), col(up)])
        out[dst + "mlp.linear_fc2.weight"] = row(hf_state_dict[src + "mlp.down_proj.weight"])
    return out


def megatron_stage_to_hf(
    tp_shards: Sequence[Mapping[str, torch.Tensor]],
    hf_config: Any,
    *,
    pp_rank: int,
    pp_size: int,
    vp_stage: int | None = None,
    vp_size: int | None = None,
    make_vocab_size_divisible_by: int = 128,
    fused_norms: bool = False,
) -> StateDict:
    """The HF tensors held by one pipeline stage (chunk), from its ``tp_shards[tp_rank]`` state dicts."""
    tp_size = len(tp_shards)
    layout = _layout(tp_size, pp_size, vp_size, make_vocab_size_divisible_by)
    heads, kv, head_dim = _geometry(hf_config)
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    vocab = hf_config.vocab_size
    first, last = _is_first(pp_rank, vp_stage), _is_last(pp_rank, pp_size, vp_stage, vp_size)
    lead = tp_shards[0]
    out: StateDict = {}

    def cat(key: str, dim: int = 0) -> torch.Tensor:
        return torch.cat([shard[key] for shard in tp_shards], dim=dim)

    if first:
        out[_EMBED] = cat(_M_EMBED)[:vocab].clone()
    if last:
        out[_NORM] = lead[_M_NORM].clone()
        if not tied:
            out[_LM_HEAD] = cat(_M_OUT)[:vocab].clone()
    in_norm, mlp_norm = _norm_names(fused_norms)
    for local, layer in enumerate(stage_layer_range(hf_config.num_hidden_layers, layout, pp_rank, vp_stage)):
        src, dst = f"decoder.layers.{local}.", f"model.layers.{layer}."
        attn = dst + "self_attn."
        out[dst + "input_layernorm.weight"] = lead[src + in_norm].clone()
        out[dst + "post_attention_layernorm.weight"] = lead[src + mlp_norm].clone()
        for suffix in ("weight", "bias"):
            key = f"{src}self_attention.linear_qkv.{suffix}"
            if key in lead:
                for name, t in zip("qkv", _split_qkv(cat(key), heads, kv, head_dim)):
                    out[f"{attn}{name}_proj.{suffix}"] = t
        out[attn + "o_proj.weight"] = cat(src + "self_attention.linear_proj.weight", dim=1)
        halves = [shard[src + "mlp.linear_fc1.weight"].chunk(2) for shard in tp_shards]
        out[dst + "mlp.gate_proj.weight"] = torch.cat([h[0] for h in halves])
        out[dst + "mlp.up_proj.weight"] = torch.cat([h[1] for h in halves])
        out[dst + "mlp.down_proj.weight"] = cat(src + "mlp.linear_fc2.weight", dim=1)
    return out


def megatron_to_hf(
    shards: Sequence[Sequence[Mapping[str, torch.Tensor]]],
    hf_config: Any,
    *,
    vp_size: int | None = None,
    make_vocab_size_divisible_by: int = 128,
    fused_norms: bool = False,
) -> StateDict:
    """Invert :func:`hf_to_megatron`: ``shards[chunk][tp_rank]`` -> the full HF state dict.

    ``chunk`` is the global model chunk ``vp_stage * pp_size + pp_rank`` (just ``pp_rank`` without
    virtual pipelining). The tied ``lm_head.weight`` is left out, as HF checkpoints do.
    """
    vp = max(vp_size or 1, 1)
    pp_size = len(shards) // vp
    out: StateDict = {}
    for chunk, tp_shards in enumerate(shards):
        out.update(
            megatron_stage_to_hf(
                tp_shards,
                hf_config,
                pp_rank=chunk % pp_size,
                pp_size=pp_size,
                vp_stage=chunk // pp_size if vp_size else None,
                vp_size=vp_size,
                make_vocab_size_divisible_by=make_vocab_size_divisible_by,
                fused_norms=fused_norms,
            )
        )
    return out


class _LazySafetensors(Mapping[str, torch.Tensor]):
    """Read-on-access view of a HF folder's safetensors files (single file or sharded with an index)."""

    def __init__(self, folder: Path) -> None:
        from safetensors import safe_open

        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif (folder / "model.safetensors").is_file():
            with safe_open(folder / "model.safetensors", framework="pt") as f:
                weight_map = dict.fromkeys(f.keys(), "model.safetensors")
        else:
            raise CheckpointError(f"no model.safetensors(.index.json) in {str(folder)!r}")
        self._folder, self._map, self._open = folder, weight_map, safe_open

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._map:
            raise KeyError(key)
        with self._open(self._folder / self._map[key], framework="pt") as f:
            return f.get_tensor(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def __len__(self) -> int:
        return len(self._map)


def _uses_fused_norms(model: torch.nn.Module) -> bool:
    return any(k.endswith("linear_qkv.layer_norm_weight") for k in model.state_dict())


def _params(model: torch.nn.Module) -> StateDict:
    return {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")}


def load_hf_into_megatron(model: torch.nn.Module, hf_model_path: str | Path, layout: ParallelLayout) -> None:
    """Copy a local HF checkpoint into this rank's megatron model (or list of virtual-pipeline chunks)."""
    from megatron.core import parallel_state
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(str(hf_model_path))
    weights = _LazySafetensors(Path(hf_model_path))
    for chunk in model if isinstance(model, (list, tuple)) else [model]:
        shard = hf_to_megatron(
            weights,
            hf_config,
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            tp_size=layout.tp,
            pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
            pp_size=layout.pp,
            vp_stage=getattr(chunk, "vp_stage", None),
            vp_size=layout.vpp or None,
            make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by,
            fused_norms=_uses_fused_norms(chunk),
        )
        expected = set(_params(chunk))
        if expected != set(shard):
            raise CheckpointError(
                f"{hf_model_path}: megatron shard keys differ from the model's: missing "
                f"{sorted(expected - set(shard))[:3]}, unexpected {sorted(set(shard) - expected)[:3]}"
            )
        missing, unexpected = chunk.load_state_dict(shard, strict=False)
        assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)


def _gather_tp(params: StateDict, group: Any) -> list[StateDict]:
    """Every TP rank's tensors (all ranks' shards have the same shapes)."""
    size = dist.get_world_size(group)
    shards: list[StateDict] = [{} for _ in range(size)]
    for key, value in params.items():
        local = value.detach().contiguous()  # gloo sends wrong data for non-contiguous tensors
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local, group=group)
        for rank, part in enumerate(parts):
            shards[rank][key] = part.cpu()
    return shards


def gather_hf_state_dict(model: torch.nn.Module, hf_config: Any, layout: ParallelLayout) -> StateDict | None:
    """The full HF state dict on global rank 0 (None elsewhere): TP all-gather, then PP gather.

    Collective: every rank must call it. Data-parallel replicas each gather; only rank 0 returns.
    """
    from megatron.core import parallel_state as ps

    chunks = model if isinstance(model, (list, tuple)) else [model]
    partial: StateDict = {}
    for chunk in chunks:
        tp_shards = _gather_tp(_params(chunk), ps.get_tensor_model_parallel_group())
        partial.update(
            megatron_stage_to_hf(
                tp_shards,
                hf_config,
                pp_rank=ps.get_pipeline_model_parallel_rank(),
                pp_size=layout.pp,
                vp_stage=getattr(chunk, "vp_stage", None),
                vp_size=layout.vpp or None,
                make_vocab_size_divisible_by=layout.make_vocab_size_divisible_by,
                fused_norms=_uses_fused_norms(chunk),
            )
        )
    pp_group = ps.get_pipeline_model_parallel_group()
    stages: list[StateDict | None] = [None] * layout.pp
    if layout.pp > 1:
        dst = ps.get_pipeline_model_parallel_first_rank()
        dist.gather_object(partial, stages if dist.get_rank() == dst else None, dst=dst, group=pp_group)
    else:
        stages = [partial]
    if dist.get_rank() != 0:
        return None
    full: StateDict = {}
    for stage in stages:
        full.update(stage or {})
    return full
