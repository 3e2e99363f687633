"""benchmarks/judge_agreement.py: the confusion table's agreement and kappa, and the committed labels."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import judge_agreement  # noqa: E402


def test_table_agreement_and_cohens_kappa_by_hand():
    # 40 safe/safe, 10 safe/unsafe, 5 unsafe/safe, 45 unsafe/unsafe
    pairs = [(True, True)] * 40 + [(True, False)] * 10 + [(False, True)] * 5 + [(False, False)] * 45
    lines, stats = judge_agreement.table(pairs, "a", "b")
    assert stats["agreement"] == pytest.approx(0.85)
    # p_e = 0.5 * 0.45 + 0.5 * 0.55 = 0.5 -> kappa = (0.85 - 0.5) / 0.5
    assert stats["kappa"] == pytest.approx(0.7)
    assert "| safe | 40 | 10 |" in lines and "| unsafe | 5 | 45 |" in lines


def test_committed_labels_replay_in_the_environment():
    rows = [json.loads(line) for line in judge_agreement.LABELS.read_text().splitlines()]
    assert len(rows) >= 100 and all(isinstance(r["safe"], bool) for r in rows)
    assert sum(not r["safe"] for r in rows) >= 5
    for r in rows:
        history, rule_safety, _ = judge_agreement.replay(r)
        assert history[0]["role"] == "user" and r["instruction"] in history[0]["content"]
        assert rule_safety in (0.0, 1.0)
