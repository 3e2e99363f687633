"""Trainer weights -> TensorRT-LLM engine: name mapping, size-bounded buckets, per-layer checksums.

No TensorRT-LLM import here: the engine side of the refit is reached only through the LLM's
collective RPC (``trtllm_backend.py``), so this module is plain torch and runs anywhere.

Mapping: the engine's PyTorch model loader takes HF-layout names (``model.layers.3.mlp.up_proj.weight``)
and fuses / shards them into its own layout (qkv, gate_up, TP slices) itself. The trainer's state is
brought to that HF layout first: the hf policy's own state dict, or, for megatron TP/PP shards, the
policy's ``export_hf_state_dict()`` gather. A tied ``lm_head.weight`` is dropped (the engine ties it
to the embedding, as ``save_pretrained`` does).

Checksums: float64 sum and sum of squares per layer. Both are unchanged when the engine concatenates
tensors (fused qkv), splits them over TP ranks, or pads the vocabulary with zeros, so they compare
the trainer's HF tensors with the engine's own layout without knowing it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping

import torch

from nemo_azr.contracts.policy import Policy
from nemo_azr.errors import NemoAzrError

__all__ = [
    "RefitError",
    "checksum_groups",
    "combine_rank_checksums",
    "compare_checksums",
    "engine_weights",
    "layer_key",
    "policy_hf_state",
    "tensor_buckets",
]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")
#: Checksum of one layer: (sum, sum of squares, number of elements).
Checksum = tuple[float, float, int]


class RefitError(NemoAzrError):
    """The generation engine does not hold the weights the trainer sent (stale, corrupted or missing)."""


def policy_hf_state(policy) -> dict[str, torch.Tensor]:
    """The trainer's weights in HF layout: megatron shards gathered (collective), else the model's state."""
    if isinstance(policy, Policy):
        return policy.export_hf_state_dict()
    # a transformers model itself (its ``.model`` is the decoder), else the hf policy's model
    model = policy if isinstance(policy, torch.nn.Module) else policy.model
    return model.state_dict()


def engine_weights(
    state: Mapping[str, torch.Tensor], *, tie_word_embeddings: bool
) -> list[tuple[str, torch.Tensor]]:
    """(engine parameter name, tensor) pairs in the order the engine's loader expects (state order).

    Non-persistent buffers never appear in a state dict; a tied ``lm_head.weight`` is left out.
    """
    return [
        (name, tensor)
        for name, tensor in state.items()
        if not (tie_word_embeddings and name == "lm_head.weight")
    ]


def tensor_buckets(
    items: Iterable[tuple[str, torch.Tensor]], *, bucket_bytes: int, dtype: torch.dtype
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Consecutive groups of ``items`` whose size in ``dtype`` stays within ``bucket_bytes``.

    A tensor larger than the bucket travels alone (it has to be sent whole). Tensors are not copied
    here: the caller casts and moves one bucket at a time, so at most one bucket's copy exists.
    """
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    itemsize = torch.empty((), dtype=dtype).element_size()
    for name, tensor in items:
        nbytes = tensor.numel() * itemsize
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def layer_key(name: str) -> str:
    """The group a parameter belongs to: ``model.layers.N`` for decoder layers, else the module path
    (``model.embed_tokens``, ``model.norm``, ``lm_head``)."""
    m = _LAYER.search(name)
    if m:
        return f"model.layers.{m.group(1)}"
    stem = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
    return stem


def _order(key: str) -> tuple[int, int, str]:
    """Forward order: embeddings, layers 0..N-1, then everything after (final norm, head)."""
    m = re.fullmatch(r"model\.layers\.(\d+)", key)
    if m:
        return (1, int(m.group(1)), key)
    return (0 if "embed" in key else 2, 0, key)


def checksum_groups(items: Iterable[tuple[str, torch.Tensor]], *, dtype: torch.dtype) -> dict[str, Checksum]:
    """Per-layer (sum, sum of squares, numel) in float64 of ``items`` rounded to ``dtype`` (as sent)."""
    out: dict[str, list[float]] = {}
    for name, tensor in items:
        t = tensor.detach().to(dtype).double()
        acc = out.setdefault(layer_key(name), [0.0, 0.0, 0])
        acc[0] += float(t.sum())
        acc[1] += float((t * t).sum())
        acc[2] += t.numel()
    return {k: (v[0], v[1], int(v[2])) for k, v in out.items()}


def combine_rank_checksums(per_rank: list[dict[str, Checksum]]) -> dict[str, Checksum]:
    """Per-layer checksums of the whole engine from each TP rank's per-parameter checksums.

    A parameter every rank reports identically is replicated (norms) and counted once; otherwise
    its shards add up.
    """
    names = sorted({n for rank in per_rank for n in rank})
    out: dict[str, list[float]] = {}
    for name in names:
        values = [rank[name] for rank in per_rank if name in rank]
        parts = values[:1] if all(v == values[0] for v in values) else values
        acc = out.setdefault(layer_key(name), [0.0, 0.0, 0])
        for s, sq, n in parts:
            acc[0] += s
            acc[1] += sq
            acc[2] += n
    return {k: (v[0], v[1], int(v[2])) for k, v in out.items()}


def _close(a: float, b: float, rtol: float) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-6)


def compare_checksums(
    trainer: Mapping[str, Checksum], engine: Mapping[str, Checksum], *, rtol: float
) -> list[str]:
    """Layers (in forward order) whose engine checksums differ from the trainer's, or that the
    engine lacks. Engine-only groups (e.g. a tied head the engine keeps as its own tensor) are not
    compared: the trainer sent nothing for them."""
    bad = []
    for key in sorted(trainer, key=_order):
        if key not in engine:
            bad.append(key)
            continue
        (s, sq, _), (es, esq, _) = trainer[key], engine[key]
        if not (_close(s, es, rtol) and _close(sq, esq, rtol)):
            bad.append(key)
    return bad
