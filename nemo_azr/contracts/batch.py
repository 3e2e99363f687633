"""``Batch``: the one data carrier through rollout -> reward -> advantage -> update.

Tensors (``[B, ...]``) live in ``tensors``; per-row non-tensor values (ids, roles, texts) live in
``meta`` as lists of length ``B``; batch-level facts (sampling settings, counters) in ``info``.
Every row operation (index, concat, repeat, chunk) keeps tensors and meta aligned.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_azr.contracts.fields import ATTENTION_MASK, INPUT_IDS, TOKEN_LEVEL_KEYS
from nemo_azr.errors import BatchContractError

#: Right-padding values used by ``concat`` for token-level tensors of different lengths.
PAD_VALUES: dict[str, float | int] = {INPUT_IDS: 0, ATTENTION_MASK: 0}


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list[Any]] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_rows()

    # --- shape ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        for value in self.tensors.values():
            return int(value.shape[0])
        for values in self.meta.values():
            return len(values)
        return 0

    def _check_rows(self) -> None:
        sizes = {k: int(v.shape[0]) for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.meta.items()})
        if len(set(sizes.values())) > 1:
            detail = ", ".join(f"{k}={n}" for k, n in sizes.items())
            raise BatchContractError(f"batch rows disagree: {detail}")

    @property
    def seq_len(self) -> int:
        return int(self.tensors[INPUT_IDS].shape[1])

    # --- dict-like access -------------------------------------------------------------------------
    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.meta

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.meta:
            return self.meta[key]
        raise KeyError(key)

    def __setitem__(self, key: str, value: Any) -> None:
        n = len(self)
        if isinstance(value, torch.Tensor):
            if self and value.shape[0] != n:
                raise BatchContractError(f"cannot set {key!r} with {value.shape[0]} rows on a batch of {n}")
            self.meta.pop(key, None)
            self.tensors[key] = value
        else:
            value = list(value)
            if self and len(value) != n:
                raise BatchContractError(f"cannot set {key!r} with {len(value)} rows on a batch of {n}")
            self.tensors.pop(key, None)
            self.meta[key] = value

    def __bool__(self) -> bool:
        return bool(self.tensors or self.meta)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 (this *is* get)

    def keys(self) -> list[str]:
        return [*self.tensors, *self.meta]

    # --- row / column operations ------------------------------------------------------------------
    def select(self, keys: Iterable[str]) -> Batch:
        """A batch with only ``keys`` (tensors and meta), sharing storage."""
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"select: keys not in batch: {missing}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.meta.items() if k in keys},
            dict(self.info),
        )

    def index(self, rows: torch.Tensor | Sequence[int] | slice) -> Batch:
        """Rows by integer indices, a boolean mask or a slice (order as given)."""
        if isinstance(rows, slice):
            idx = list(range(len(self)))[rows]
        elif isinstance(rows, torch.Tensor) and rows.dtype == torch.bool:
            idx = rows.nonzero(as_tuple=True)[0].tolist()
        elif isinstance(rows, torch.Tensor):
            idx = rows.tolist()
        else:
            idx = [int(i) for i in rows]
        index_tensor = torch.as_tensor(idx, dtype=torch.long)
        tensors = {k: v.index_select(0, index_tensor.to(v.device)) for k, v in self.tensors.items()}
        meta = {k: [v[i] for i in idx] for k, v in self.meta.items()}
        return Batch(tensors, meta, dict(self.info))

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Stack rows; token-level tensors of different lengths are right-padded to the longest."""
        batches = [b for b in batches if b]
        if not batches:
            return Batch()
        keys_t = set(batches[0].tensors)
        keys_m = set(batches[0].meta)
        for b in batches[1:]:
            if set(b.tensors) != keys_t or set(b.meta) != keys_m:
                raise BatchContractError(
                    "concat: batches have different keys: "
                    f"{sorted(keys_t | keys_m)} vs {sorted(set(b.tensors) | set(b.meta))}"
                )
        tensors = {}
        for key in batches[0].tensors:
            parts = [b.tensors[key] for b in batches]
            if key in TOKEN_LEVEL_KEYS and parts[0].dim() >= 2:
                width = max(p.shape[1] for p in parts)
                pad = PAD_VALUES.get(key, 0)
                parts = [_right_pad(p, width, pad) for p in parts]
            tensors[key] = torch.cat(parts, dim=0)
        meta = {k: [x for b in batches for x in b.meta[k]] for k in batches[0].meta}
        info = {}
        for b in batches:
            info.update(b.info)
        return Batch(tensors, meta, info)

    def repeat(self, n: int, *, interleave: bool = True) -> Batch:
        """Each row ``n`` times: ``aabb`` when ``interleave`` else ``abab``."""
        rows = len(self)
        if interleave:
            idx = [i for i in range(rows) for _ in range(n)]
        else:
            idx = [i for _ in range(n) for i in range(rows)]
        return self.index(idx)

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        if size <= 0:
            raise ValueError("split size must be positive")
        return [self.index(slice(s, s + size)) for s in range(0, len(self), size)]

    def chunk(self, chunks: int) -> list[Batch]:
        """``chunks`` near-equal consecutive pieces (like ``torch.chunk``)."""
        if chunks <= 0:
            raise ValueError("number of chunks must be positive")
        size = -(-len(self) // chunks)
        return self.split(size) if len(self) else []

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta), dict(self.info))

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __repr__(self) -> str:
        ts = ", ".join(f"{k}{list(v.shape)}" for k, v in self.tensors.items())
        ms = ", ".join(self.meta)
        return f"Batch(rows={len(self)}, tensors=[{ts}], meta=[{ms}])"


def _right_pad(t: torch.Tensor, width: int, value: float | int) -> torch.Tensor:
    if t.shape[1] == width:
        return t
    pad_shape = (t.shape[0], width - t.shape[1], *t.shape[2:])
    return torch.cat([t, t.new_full(pad_shape, value)], dim=1)
