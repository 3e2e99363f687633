"""Micro-batches for the training forward/backward: by row count, or by a token budget.

RL batches mix short and long responses. Splitting by a fixed row count makes every micro-batch as
wide as its longest row; ``algorithm.max_tokens_per_microbatch`` instead fills each micro-batch up to
a token budget (longest rows first, first-fit decreasing), and trims each one to its own width. The
losses are normalised by mini-batch totals (``num_tokens``, ``num_seqs``), so uneven micro-batches
still sum to exactly the gradient of one big batch.

The budget counts what a micro-batch costs: ``rows x width`` when padded, the sum of its rows' real
tokens when packed (``model.sequence_packing``: the rows run concatenated, see ``packing.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F


def real_lengths(batch: Batch) -> torch.Tensor:
    """Real (attention-masked) tokens per row, ``[B]`` int64."""
    return batch[F.ATTENTION_MASK].sum(dim=1).long()


def trim_padding(batch: Batch) -> tuple[Batch, int]:
    """The batch without the leading / trailing columns that are padding in every row, and the
    number of leading columns dropped."""
    real = batch[F.ATTENTION_MASK].bool().any(dim=0).nonzero()
    if len(real) == 0:
        return batch, 0
    start, stop = int(real[0]), int(real[-1]) + 1
    if start == 0 and stop == batch.seq_len:
        return batch, 0
    tensors = {
        k: v[:, start:stop] if k in F.TOKEN_LEVEL_KEYS and v.dim() >= 2 else v
        for k, v in batch.tensors.items()
    }
    return Batch(tensors, dict(batch.meta), dict(batch.info)), start


def token_budget_groups(lengths: list[int], max_tokens: int, *, packed: bool) -> list[list[int]]:
    """Row indices per micro-batch, each within ``max_tokens`` (a row longer than the budget goes
    alone). First-fit decreasing: rows sorted longest first, each into the first micro-batch it fits.
    Cost of a micro-batch: the sum of its lengths (packed) or rows x its longest (padded)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    cost_state: list[tuple[int, int]] = []  # (sum of lengths, longest) per group
    for i in order:
        n = lengths[i]
        for g, (total, longest) in enumerate(cost_state):
            # Rows arrive longest first, so a group's width is its first row's length.
            cost = total + n if packed else (len(groups[g]) + 1) * longest
            if cost <= max_tokens:
                groups[g].append(i)
                cost_state[g] = (total + n, longest)
                break
        else:
            groups.append([i])
            cost_state.append((n, n))
    return [sorted(g) for g in groups]


def row_groups(
    lengths: list[int], *, rows: int, max_tokens: int = 0, packed: bool = False
) -> list[list[int]]:
    """Row indices per micro-batch of rows of real ``lengths``: consecutive pieces of ``rows`` rows
    (``max_tokens == 0``), or :func:`token_budget_groups`."""
    if max_tokens > 0:
        return token_budget_groups(lengths, max_tokens, packed=packed)
    return [list(range(s, min(s + rows, len(lengths)))) for s in range(0, len(lengths), rows)]


@dataclass
class MicroBatch:
    """Rows ``rows`` of a batch, trimmed: its column 0 is the source's column ``start``."""

    rows: torch.Tensor
    batch: Batch
    start: int = 0

    def place(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """``values[b, t]`` of this micro-batch on the source batch's ``width`` columns."""
        return torch.nn.functional.pad(values, (self.start, width - self.start - values.shape[1]))


def micro_batches(batch: Batch, *, rows: int, max_tokens: int = 0, packed: bool = False) -> list[MicroBatch]:
    """Micro-batches covering ``batch`` once.

    ``max_tokens == 0``: consecutive pieces of ``rows`` rows, untrimmed (the fixed-row schedule).
    Otherwise token-budget micro-batches (see :func:`token_budget_groups`), each trimmed to its width.
    """
    if max_tokens <= 0:
        starts = range(0, len(batch), rows)
        return [
            MicroBatch(torch.arange(s, min(s + rows, len(batch))), mb)
            for s, mb in zip(starts, batch.split(rows))
        ]
    out = []
    for group in token_budget_groups(real_lengths(batch).tolist(), max_tokens, packed=packed):
        idx = torch.as_tensor(group, dtype=torch.long)
        trimmed, start = trim_padding(batch.index(idx))
        out.append(MicroBatch(idx, trimmed, start))
    return out


def gather_micro_outputs(
    parts: list[tuple[MicroBatch, torch.Tensor]], num_rows: int, width: int
) -> torch.Tensor:
    """Per-micro-batch ``[b, t]`` outputs (float32, CPU) back into ``[num_rows, width]`` in row order."""
    out = torch.zeros(num_rows, width)
    for micro, values in parts:
        out[micro.rows] = micro.place(values.float().cpu(), width)
    return out
