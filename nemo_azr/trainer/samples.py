"""Sample logging: what the model actually wrote, a few rows per step.

Rewards can be gamed and parsers can silently fail; the only way to see it is to read the text.
Each step logs ``logger.samples_per_step`` rows (the first row of that many different groups, so
several prompts are shown) to ``<output_dir>/samples.jsonl``; ``logger.console_samples`` also
prints them at the console interval, and W&B gets them as a table.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F

SAMPLES_FILE = "samples.jsonl"
#: Per-row meta copied into a sample record when the workflow provides it.
EXTRA_META = ("role", "sample_type", "finish_reason", "answer_correct", "confidence", "format_ok")
MAX_CONSOLE_CHARS = 300


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def select_samples(batch: Batch, k: int, *, step: int) -> list[dict[str, Any]]:
    """Records of ``k`` rows: the first row of distinct groups, taken in turn from each kind of row
    (``role`` x ``sample_type``: answers and confidences, proposer and solver), in row order."""
    if k <= 0 or len(batch) == 0:
        return []
    n = len(batch)
    groups = batch.meta.get(F.GROUP_ID) or [str(i) for i in range(n)]
    roles = batch.meta.get(F.ROLE) or [""] * n
    types = batch.meta.get(F.SAMPLE_TYPE) or [""] * n
    firsts: dict[tuple, list[int]] = {}  # kind -> first row of each group, in row order
    seen: set = set()
    for i in range(n):
        kind = (roles[i], types[i])
        if (kind, groups[i]) not in seen:
            seen.add((kind, groups[i]))
            firsts.setdefault(kind, []).append(i)
    picked: list[int] = []
    for rank in range(max(len(rows) for rows in firsts.values())):
        picked.extend(rows[rank] for rows in firsts.values() if rank < len(rows))
    return [_record(batch, i, step) for i in sorted(picked[:k])]


def _record(batch: Batch, i: int, step: int) -> dict[str, Any]:
    prompts = batch.meta.get(F.PROMPT_TEXT)
    responses = batch.meta.get(F.RESPONSE_TEXT)
    groups = batch.meta.get(F.GROUP_ID)
    rewards = batch.tensors.get(F.REWARDS)
    record: dict[str, Any] = {
        "step": step,
        "group_id": _plain(groups[i]) if groups else i,
        "prompt": _plain(prompts[i]) if prompts else "",
        "response": _plain(responses[i]) if responses else "",
        "reward": float(rewards[i]) if rewards is not None else None,
    }
    for key in EXTRA_META:
        values = batch.meta.get(key)
        if values is not None and i < len(values):
            record[key] = _plain(values[i])
    return record


def format_samples(records: list[dict[str, Any]]) -> str:
    """Readable console lines: prompt, response and reward of each record."""

    def short(text: Any) -> str:
        text = str(text).replace("\n", "\\n")
        return text if len(text) <= MAX_CONSOLE_CHARS else text[:MAX_CONSOLE_CHARS] + "..."

    lines = []
    for r in records:
        reward = "n/a" if r.get("reward") is None else f"{r['reward']:.3g}"
        lines.append(f"  [reward {reward}] {short(r['prompt'])}\n    -> {short(r['response'])}")
    return "\n".join(lines)
