"""The preference-data contract (seed 004, class 5): rows with a label, paired rows linked by a pair id.

A preference batch holds one row per response (prompt + response tokens, ``loss_mask`` on the
response) with ``preference_label`` [B] (1 chosen / desirable, 0 rejected / undesirable). Paired
losses (DPO, IPO) also need ``pair_id`` meta: each pair id on exactly one chosen and one rejected
row, sharing their prompt. Unpaired ones (KTO) need the label only, plus mismatched rows (``kl_row``
meta True: one example's prompt with another example's response, label not read) whose log-ratios
estimate KTO's reference point. :func:`validate_preference_batch` names the first key or pair that
breaks this; :func:`pair_rows` gives the chosen and rejected row of each pair, in the order the
pairs first appear; :func:`kto_rows` splits a KTO batch into its examples and its mismatched rows.
"""

from __future__ import annotations

import torch

from nemo_azr.contracts import fields as F
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError

__all__ = ["kto_rows", "pair_rows", "validate_preference_batch"]


def validate_preference_batch(batch: Batch, *, paired: bool, kl_rows: bool = False) -> None:
    """Raise :class:`BatchContractError` naming what a preference update cannot use (``kl_rows``:
    the batch must also hold KTO's mismatched rows)."""
    for key in (F.INPUT_IDS, F.ATTENTION_MASK, F.LOSS_MASK, F.PREFERENCE_LABEL):
        if key not in batch.tensors:
            have = ", ".join(sorted(batch.keys())) or "nothing"
            raise BatchContractError(f"preference batch: missing key {key!r}; batch has: {have}")
    labels = batch.tensors[F.PREFERENCE_LABEL]
    if labels.dim() != 1 or labels.shape[0] != len(batch):
        raise BatchContractError(
            f"preference batch: {F.PREFERENCE_LABEL!r} must be [{len(batch)}] (one label per row), "
            f"got {list(labels.shape)}"
        )
    labelled = ~_kl_row_mask(batch) if kl_rows else torch.ones(len(batch), dtype=torch.bool)
    if not bool(((labels == 0) | (labels == 1))[labelled].all()):
        raise BatchContractError(f"preference batch: {F.PREFERENCE_LABEL!r} must hold 0 or 1 only")
    if not bool((batch.tensors[F.LOSS_MASK].sum(-1) > 0).all()):
        raise BatchContractError("preference batch: a row has no response token (loss_mask all 0)")
    if paired:
        pair_rows(batch)
    if kl_rows:
        kto_rows(batch)


def _kl_row_mask(batch: Batch) -> torch.Tensor:
    if F.KL_ROW not in batch.meta:
        have = ", ".join(sorted(batch.meta)) or "nothing"
        raise BatchContractError(
            f"preference batch: KTO needs per-row meta {F.KL_ROW!r} (its mismatched rows); meta has: {have}"
        )
    return torch.tensor([bool(v) for v in batch.meta[F.KL_ROW]], dtype=torch.bool)


def kto_rows(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(labelled example row indices, mismatched ``kl_row`` indices); each part must be non-empty."""
    is_kl = _kl_row_mask(batch)
    examples, mismatched = (~is_kl).nonzero().flatten(), is_kl.nonzero().flatten()
    if len(examples) == 0 or len(mismatched) == 0:
        raise BatchContractError(
            f"preference batch: KTO needs labelled rows and {F.KL_ROW!r} rows, got {len(examples)} and "
            f"{len(mismatched)}"
        )
    return examples, mismatched


def pair_rows(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen row indices, rejected row indices), one of each per pair id."""
    if F.PAIR_ID not in batch.meta:
        have = ", ".join(sorted(batch.meta)) or "nothing"
        raise BatchContractError(
            f"preference batch: paired losses need per-row meta {F.PAIR_ID!r}; meta has: {have}"
        )
    labels = batch.tensors[F.PREFERENCE_LABEL].tolist()
    rows: dict[object, dict[int, list[int]]] = {}
    for i, (pid, label) in enumerate(zip(batch.meta[F.PAIR_ID], labels)):
        rows.setdefault(pid, {0: [], 1: []})[int(label)].append(i)
    chosen, rejected = [], []
    for pid, by_label in rows.items():
        if len(by_label[1]) != 1 or len(by_label[0]) != 1:
            raise BatchContractError(
                f"preference batch: pair {pid!r} has {len(by_label[1])} chosen and {len(by_label[0])} "
                "rejected row(s); a pair is one of each"
            )
        chosen.append(by_label[1][0])
        rejected.append(by_label[0][0])
    return torch.tensor(chosen), torch.tensor(rejected)
