"""Calibration metrics against scikit-learn (Brier, AUROC) and a straightforward ECE reference."""

import json
import math
import random

import pytest

from nemo_azr.rlcr import (
    auroc,
    auroc_standard_error,
    calibration_metrics,
    plot_reliability_diagram,
    reliability_bins,
)

sklearn_metrics = pytest.importorskip("sklearn.metrics")


def _ece_reference(confidences, correct, n_bins):
    """ECE written out: for each bin [k/n, (k+1)/n) (the last bin closed), |acc - conf| weighted by its share."""
    total = 0.0
    n = len(confidences)
    for k in range(n_bins):
        lo, hi = k / n_bins, (k + 1) / n_bins
        members = [
            (c, y) for c, y in zip(confidences, correct) if lo <= c < hi or (k == n_bins - 1 and c == 1.0)
        ]
        if not members:
            continue
        acc = sum(y for _, y in members) / len(members)
        conf = sum(c for c, _ in members) / len(members)
        total += len(members) / n * abs(acc - conf)
    return total


def _sample(seed, n, grid):
    rng = random.Random(seed)
    confidences = [round(rng.random(), 1) if grid else rng.random() for _ in range(n)]  # grid: many ties
    correct = [1 if rng.random() < c * 0.8 + 0.1 else 0 for c in confidences]
    return confidences, correct


@pytest.mark.parametrize(
    ("seed", "n", "grid"), [(0, 50, False), (1, 200, True), (2, 7, True), (3, 1000, False)]
)
@pytest.mark.parametrize("n_bins", [10, 5])
def test_matches_sklearn_and_reference(seed, n, grid, n_bins):
    confidences, correct = _sample(seed, n, grid)
    m = calibration_metrics(confidences, correct, n_bins=n_bins)
    assert set(m) >= {"ece", "brier", "auroc", "accuracy"}
    assert m["brier"] == pytest.approx(sklearn_metrics.brier_score_loss(correct, confidences), abs=1e-12)
    assert m["auroc"] == pytest.approx(sklearn_metrics.roc_auc_score(correct, confidences), abs=1e-12)
    assert m["ece"] == pytest.approx(_ece_reference(confidences, correct, n_bins), abs=1e-12)
    assert m["accuracy"] == pytest.approx(sum(correct) / n)
    assert m["mean_confidence"] == pytest.approx(sum(confidences) / n)
    assert m["n"] == n


def test_hand_example():
    # bins of width 0.1: bin 0 = {0.05, 0.05}; bin 9 = {0.95, 1.0} (1.0 falls in the last bin)
    confidences, correct = [0.05, 0.05, 0.95, 1.0], [0, 1, 1, 0]
    m = calibration_metrics(confidences, correct)
    # bin 0: |0.5 - 0.05| * 2/4 = 0.225; bin 9: {0.95, 1.0} acc 0.5 conf 0.975 -> 0.475 * 2/4 = 0.2375
    assert m["ece"] == pytest.approx(0.225 + 0.2375)
    assert m["brier"] == pytest.approx((0.05**2 + 0.95**2 + 0.05**2 + 1.0) / 4)
    # positives {0.05, 0.95}, negatives {0.05, 1.0}: pairs won 0.5 (tie) + 0 + 1 + 0 = 1.5 of 4
    assert m["auroc"] == pytest.approx(1.5 / 4)


def test_perfect_and_degenerate_cases():
    m = calibration_metrics([1.0, 0.0, 1.0, 0.0], [1, 0, 1, 0])
    assert m["ece"] == 0.0 and m["brier"] == 0.0 and m["auroc"] == 1.0
    one_class = calibration_metrics([0.3, 0.9], [1, 1])
    assert math.isnan(one_class["auroc"]) and one_class["accuracy"] == 1.0
    empty = calibration_metrics([], [])
    assert empty["n"] == 0 and all(math.isnan(empty[k]) for k in ("ece", "brier", "auroc", "accuracy"))
    with pytest.raises(ValueError):
        calibration_metrics([1.2], [1])
    with pytest.raises(ValueError):
        calibration_metrics([0.5], [2])
    with pytest.raises(ValueError):
        calibration_metrics([0.5, 0.4], [1])


def test_reliability_bins_and_diagram(tmp_path):
    confidences, correct = _sample(5, 300, grid=False)
    bins = reliability_bins(confidences, correct, n_bins=10)
    assert len(bins) == 10 and sum(b["count"] for b in bins) == 300
    for b in bins:
        if b["count"]:
            assert b["lo"] <= b["confidence"] <= b["hi"]
    path = plot_reliability_diagram(bins, tmp_path / "r.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    json.dumps(bins)  # JSON-serialisable as written by eval


def test_calibration_eval_reports_calibration_within_each_question_kind(tmp_path):
    """``by_kind`` in metrics.json: per kind, its answers' accuracy and its parsed confidences' mean,
    AUROC, ECE and Brier. A confidence that only tells the kinds apart (0.9 on lookups, right 3 of 4
    times; 0.1 on word problems, right 1 of 4) scores AUROC 0.75 over all answers and 0.5 within
    each kind."""
    import json
    from types import SimpleNamespace

    import torch

    from nemo_azr.config.schema import NemoAzrConfig
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.task import Example
    from nemo_azr.evaluation.rlcr import run_calibration_eval
    from nemo_azr.rlcr.common import ANSWER_CORRECT, CONFIDENCE, FORMAT_OK, HAS_CONFIDENCE

    lookup = Example("q0", "lookup?", "1", {"kind": "lookup"})
    word = Example("q1", "word?", "2", {"kind": "word"})
    # (example, sample_type, answer right?, confidence)
    answers = [(lookup, "answer", y, None) for y in (1.0, 1.0, 1.0, 0.0)]
    answers += [(word, "answer", y, None) for y in (1.0, 0.0, 0.0, 0.0)]
    confidences = [(ex, "confidence", y, 0.9 if ex is lookup else 0.1) for ex, _, y, _ in answers]
    rows = [
        *answers,
        *confidences,
        (word, "confidence", 0.0, None),
    ]  # unparsed: left out of its kind's numbers
    n = len(rows)
    batch = Batch(
        {F.REWARDS: torch.zeros(n)},
        {
            F.PROMPT_ID: [r[0].prompt_id for r in rows],
            F.PROMPT_TEXT: [r[0].question for r in rows],
            F.RESPONSE_TEXT: ["..."] * n,
            F.SAMPLE_TYPE: [r[1] for r in rows],
            ANSWER_CORRECT: [r[2] for r in rows],
            HAS_CONFIDENCE: [r[1] == "confidence" for r in rows],
            CONFIDENCE: [r[3] for r in rows],
            FORMAT_OK: [True] * n,
            "example": [r[0] for r in rows],
        },
    )
    run = SimpleNamespace(
        cfg=NemoAzrConfig(),
        batches=lambda: iter([batch]),
        summary=lambda: {},
        output_dir=lambda: tmp_path,
    )
    result = run_calibration_eval(run)
    # Per kind by hand: lookup: ECE |0.75 - 0.9|, Brier (3 * 0.1^2 + 0.9^2) / 4; word: ECE |0.25 - 0.1|,
    # Brier (0.9^2 + 3 * 0.1^2) / 4; every confidence of a kind is tied, so AUROC 0.5 within it.
    # Its Hanley-McNeil error at A = 1/2 over 3 and 1 answers of a class (Q1 = Q2 = 1/3):
    # var = (1/4 + 2 (1/3 - 1/4) + 0) / 3 in each kind.
    se = round(math.sqrt((0.25 + 2 * (1 / 3 - 0.25)) / 3), 4)
    expected = {"num_answers": 4, "n": 4, "auroc": 0.5, "auroc_se": se, "ece": 0.15, "brier": 0.21}
    assert result["by_kind"] == {
        "lookup": {**expected, "answer_accuracy": 0.75, "mean_confidence": 0.9},
        "word": {**expected, "answer_accuracy": 0.25, "mean_confidence": 0.1},
    }
    # Over all answers: 3 right at 0.9 and 1 at 0.1 against 1 wrong at 0.9 and 3 at 0.1:
    # (3*3 + 0.5*(3*1 + 1*3)) / 16 = 0.75.
    assert result["auroc"] == pytest.approx(0.75)
    assert json.loads((tmp_path / "metrics.json").read_text())["by_kind"] == result["by_kind"]
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["kind"] for s in samples] == [r[0].meta["kind"] for r in rows]


def test_step_metrics_auroc_by_hand():
    from nemo_azr.rlcr.common import calibration_step_metrics

    # parsed: (0.9, right), (0.8, wrong), (0.1, wrong), (0.8, right); pairs right-vs-wrong:
    # 0.9>0.8, 0.9>0.1, 0.8=0.8 (half), 0.8>0.1 -> 3.5 / 4
    m = calibration_step_metrics([0.9, 0.8, None, 0.1, 0.8], [1, 0, 1, 0, 1])
    assert m["rlcr/confidence_auroc"] == pytest.approx(0.875)
    assert m["rlcr/confidence_mean"] == pytest.approx((0.9 + 0.8 + 0.1 + 0.8) / 4)
    assert "rlcr/confidence_auroc" not in calibration_step_metrics([0.9, 0.2], [1, 1])  # one class only


def test_eval_scores_the_expected_confidence_once_per_answer(tmp_path):
    """rlcr.expected_confidence_readout: the eval scores each answer's expected confidence once,
    however many confidences were sampled for it, overall and within each kind."""
    from types import SimpleNamespace

    import torch

    from nemo_azr.config.schema import NemoAzrConfig
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.task import Example
    from nemo_azr.evaluation.rlcr import run_calibration_eval
    from nemo_azr.rlcr.common import (
        ANSWER_CORRECT,
        CONFIDENCE,
        EXPECTED_CONFIDENCE,
        FORMAT_OK,
        HAS_CONFIDENCE,
    )

    lookup = Example("q0", "lookup?", "1", {"kind": "lookup"})
    # four answers, right / wrong / right / wrong, expected confidences 0.8 / 0.5 / 0.4 / 0.2; every stated
    # confidence is 0.3 (the greedy reply that tells nothing apart)
    answers = [("a0", 1.0, 0.8), ("a1", 0.0, 0.5), ("a2", 1.0, 0.4), ("a3", 0.0, 0.2)]
    rows = [(aid, "answer", y, None, None) for aid, y, _ in answers]
    rows += [(aid, "confidence", y, 0.3, e) for aid, y, e in answers for _ in range(2)]  # 2 per answer
    n = len(rows)
    batch = Batch(
        {F.REWARDS: torch.zeros(n)},
        {
            F.PROMPT_ID: ["q0"] * n,
            F.PROMPT_TEXT: ["lookup?"] * n,
            F.RESPONSE_TEXT: ["..."] * n,
            F.SUBGROUP_ID: [r[0] for r in rows],
            F.SAMPLE_TYPE: [r[1] for r in rows],
            ANSWER_CORRECT: [r[2] for r in rows],
            HAS_CONFIDENCE: [r[1] == "confidence" for r in rows],
            CONFIDENCE: [r[3] for r in rows],
            EXPECTED_CONFIDENCE: [r[4] for r in rows],
            FORMAT_OK: [True] * n,
            "example": [lookup] * n,
        },
    )
    run = SimpleNamespace(
        cfg=NemoAzrConfig(), batches=lambda: iter([batch]), summary=lambda: {}, output_dir=lambda: tmp_path
    )
    result = run_calibration_eval(run)
    assert result["auroc"] == pytest.approx(0.5)  # the stated confidence: all tied
    exp = result["expected_confidence"]
    assert exp["n"] == 4  # one point per answer, not per sampled confidence
    # right answers at 0.8 and 0.4 against wrong ones at 0.5 and 0.2: 3 of 4 pairs ordered -> 0.75
    assert exp["auroc"] == pytest.approx(0.75)
    # Brier by hand: ((0.8 - 1)^2 + 0.5^2 + (0.4 - 1)^2 + 0.2^2) / 4
    assert exp["brier"] == pytest.approx((0.04 + 0.25 + 0.36 + 0.04) / 4)
    assert result["by_kind"]["lookup"]["expected_auroc"] == pytest.approx(0.75)
    assert result["by_kind"]["lookup"]["auroc"] == pytest.approx(0.5)
    # Hanley-McNeil over the 2 right and 2 wrong answers, A = 0.75: Q1 = 0.75/1.25, Q2 = 2*0.75^2/1.75
    var = (0.75 * 0.25 + (0.6 - 0.5625) + (2 * 0.5625 / 1.75 - 0.5625)) / 4
    assert result["by_kind"]["lookup"]["expected_auroc_se"] == pytest.approx(math.sqrt(var), abs=1e-4)


def test_auroc_standard_error_by_hand_and_without_both_classes():
    # A = 0.75 over 10 right and 20 wrong: Q1 = 0.75/1.25 = 0.6, Q2 = 2 * 0.5625 / 1.75;
    # var = (0.1875 + 9 (0.6 - 0.5625) + 19 (Q2 - 0.5625)) / 200
    q2 = 2 * 0.5625 / 1.75
    expected = math.sqrt((0.1875 + 9 * 0.0375 + 19 * (q2 - 0.5625)) / 200)
    assert auroc_standard_error(0.75, 10, 20) == pytest.approx(expected)
    assert math.isnan(auroc_standard_error(0.75, 0, 20))
    assert math.isnan(auroc_standard_error(math.nan, 10, 20))


def test_auroc_standard_error_matches_the_spread_of_resampled_aurocs():
    # The formula against its own definition: the standard deviation of the AUROC over many
    # independent evaluations of 40 right and 60 wrong answers whose confidences are normal with
    # means 0.8 apart (true AUROC = Phi(0.8 / sqrt 2)). Hanley-McNeil is within a few percent here.
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    true_auc = 0.5 * (1 + math.erf(0.8 / math.sqrt(2) / math.sqrt(2)))
    labels = [1.0] * 40 + [0.0] * 60
    values = []
    for _ in range(2000):
        scores = np.concatenate([rng.normal(0.8, 1.0, 40), rng.normal(0.0, 1.0, 60)])
        values.append(auroc(1 / (1 + np.exp(-scores)), labels))  # squashed into [0, 1]
    assert float(np.mean(values)) == pytest.approx(true_auc, abs=0.005)
    assert auroc_standard_error(true_auc, 40, 60) == pytest.approx(float(np.std(values)), rel=0.08)
