"""benchmarks/real_model.py: the RLCR bars (AUROC after training, AUROC within each question kind)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_model  # noqa: E402


def _eval(auroc, accuracy, by_kind=None):
    out = {"ece": 0.3, "auroc": auroc, "answer_accuracy": accuracy}
    if by_kind is not None:
        out["by_kind"] = {kind: {"auroc": value, "answer_accuracy": 0.5} for kind, value in by_kind.items()}
    return out


def test_rlcr_within_kind_bar_needs_two_kinds_above_0_6():
    before = _eval(0.5, 0.40, {"pair_lookup": 0.5, "single_lookup": 0.5, "word_sub": None})
    after = _eval(0.83, 0.41, {"pair_lookup": 0.64, "single_lookup": 0.58, "word_sub": None})
    rows = {criterion: (measured, mark) for criterion, measured, mark in
            real_model.verdict("rlcr_two_turn_smollm2", {"before": before, "after": after})}  # fmt: skip
    assert rows["AUROC > 0.6 after training"] == ("0.830", "PASS")
    assert rows["AUROC within pair_lookup"] == ("0.500 -> 0.640", "> 0.6")
    assert rows["AUROC within single_lookup"] == ("0.500 -> 0.580", "")
    assert rows["AUROC within word_sub"] == ("n/a -> n/a", "")  # one class only: no AUROC
    assert rows["within-kind AUROC > 0.6 on >= 2 kinds"] == ("1 of 3", "FAIL")
    assert rows["accuracy falls <= 2 points"] == ("+1.0 points", "PASS")

    after["by_kind"]["single_lookup"]["auroc"] = 0.61
    rows = {
        c: m for c, _, m in real_model.verdict("rlcr_two_turn_smollm2", {"before": before, "after": after})
    }
    assert rows["within-kind AUROC > 0.6 on >= 2 kinds"] == "PASS"


def test_rlcr_evaluations_without_kinds_get_no_within_kind_rows():
    rows = real_model.verdict(
        "rlcr_single_turn_smollm2", {"before": _eval(0.44, 0.3), "after": _eval(0.5, 0.25)}
    )
    criteria = [c for c, _, _ in rows]
    assert criteria == [
        "ECE falls",
        "AUROC rises",
        "AUROC > 0.6 after training",
        "accuracy falls <= 2 points",
    ]
    assert dict((c, m) for c, _, m in rows)["AUROC > 0.6 after training"] == "FAIL"
    assert dict((c, m) for c, _, m in rows)["accuracy falls <= 2 points"] == "FAIL"


def _fixed(parsed, proposals, learnable, questions, asked):
    ratio, asked_ratio = learnable / questions, learnable / asked
    return {"parsed": parsed, "proposals": proposals, "learnable": learnable, "questions": questions,
            "ratio": ratio, "asked_ratio": asked_ratio}  # fmt: skip


def test_selfplay_proposer_against_a_fixed_solver_needs_a_rise_above_two_standard_errors():
    w, t = _fixed(98, 180, 30, 300, 540), _fixed(144, 180, 66, 440, 540)
    se = ((0.1 * 0.9 / 300) + (0.15 * 0.85 / 440)) ** 0.5  # 0.0243: the binomial SE of the difference
    fixed = {"warmed_up": w, "trained": t, "change": 0.05, "change_se": se, "asked_change": 66 / 540 - 30 / 540,
             "asked_change_se": 0.017}  # fmt: skip
    rows = {c: (m, v) for c, m, v in real_model._fixed_solver_verdict(fixed)}
    assert rows["held-out proposer parse rate, fixed solver, does not fall"] == ("0.544 -> 0.800", "PASS")
    rises = "held-out first-pass learnable ratio against the fixed warmed-up solver rises (> 2 SE)"
    rise = rows[rises]
    assert rise == ("0.100 -> 0.150 (+0.050 ± 0.024)", "PASS")
    asked = "held-out learnable share of all questions asked for rises against the fixed solver (> 2 SE)"
    assert rows[asked][1] == "PASS"
    fixed["change_se"] = 0.026  # the same rise, under two standard errors
    rows = {c: v for c, _, v in real_model._fixed_solver_verdict(fixed)}
    assert rows[rises] == "FAIL"
    assert real_model._fixed_solver_verdict(None) == []  # results from before the fixed-solver pass


def test_training_learnable_ratio_rises_only_with_a_slope_above_two_standard_errors():
    # A ratio that goes 0.1, 0.2, 0.1, 0.2, ... : the last window beats the first by chance, the slope is noise.
    records = [
        {"step": s, "unified_filter/initial_learnable_ratio": 0.1 if s % 2 else 0.2} for s in range(1, 21)
    ]
    trend = real_model.learnable_trend(records)
    # by hand: x = 1..20 (mean 10.5, Sxx 665), y alternates 0.1/0.2: Sxy = 0.05 * 10 = 0.5, slope 0.5/665 a step
    assert abs(trend["slope_per_10"] - round(5 / 665, 4)) < 1e-4
    assert trend["steps"] == 20 and trend["se_per_10"] > trend["slope_per_10"]
    learn = {"first": 0.15, "last": 0.16}
    criterion, measured, mark = real_model._training_learnable_verdict(learn, trend)
    assert criterion == "training first-pass learnable ratio rises (slope > 2 SE)"
    assert measured.startswith("0.150 -> 0.160 (slope +0.007 ± ")  # 0.0075 rounds down in binary
    assert mark == "FAIL"
    rising = real_model.learnable_trend(
        [{"step": s, "unified_filter/initial_learnable_ratio": 0.01 * s} for s in range(1, 21)]
    )
    assert rising["slope_per_10"] == 0.1 and rising["se_per_10"] == 0.0
    assert real_model._training_learnable_verdict(learn, rising)[2] == "PASS"
    # results from before the slope was recorded: the first/last windows, said so
    old = real_model._training_learnable_verdict(learn, None)
    assert old == (
        "training first-pass learnable ratio rises (first vs last window)",
        "0.150 -> 0.160",
        "PASS",
    )
