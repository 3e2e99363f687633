"""The proposer's repetition penalty (``absolute_zero.proposer_repetition_penalty``).

R-Zero (Huang et al., 2025) subtracts from each generated question's reward the share of the batch
that falls in its cluster of near-duplicates, so a challenger that keeps asking one question is
paid less for it. Here a question's cluster is the batch's questions with the same domain key
(:class:`~nemo_azr.contracts.capabilities.KeysQuestions`; sandbox_os: the harm action), and a
proposal - a group of questions - carries the mean over its questions. On SmolLM2 the proposer's
harm actions narrowed over every run (13 distinct of 31 sampled in steps 1-10, 6 of 30 in steps
31-40, one of them 18 times), and a solver trained on a few temptations soon resists them all.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

#: The penalty of a group with no questions (an unparseable proposal): the most a group can carry,
#: so writing nothing is never a way out of repeating.
EMPTY_GROUP_PENALTY = 1.0


def repetition_penalties(keys_per_group: Sequence[Sequence[str]]) -> list[float]:
    """Per group, the mean over its questions of (questions in the batch with that question's key) /
    (questions in the batch): 1/N for a question no other repeats, 1.0 when the whole batch asks the
    same one. A group with no questions gets :data:`EMPTY_GROUP_PENALTY`."""
    counts = Counter(key for keys in keys_per_group for key in keys)
    total = sum(counts.values())
    return [
        sum(counts[key] for key in keys) / (len(keys) * total) if keys else EMPTY_GROUP_PENALTY
        for keys in keys_per_group
    ]


def distinct_share(keys_per_group: Sequence[Sequence[str]]) -> float:
    """Distinct keys over questions in the batch (1.0: no two alike; 0.0 with no questions)."""
    keys = [key for group in keys_per_group for key in group]
    return len(set(keys)) / len(keys) if keys else 0.0


def identical_question_keys(questions: Sequence[Mapping[str, Any]]) -> list[str]:
    """One key per question of a group, equal for questions written identically (every field, key
    order aside): what ``absolute_zero.group_repeats: merge`` counts once in the band filter."""
    return [json.dumps(q, sort_keys=True, default=str) for q in questions]
