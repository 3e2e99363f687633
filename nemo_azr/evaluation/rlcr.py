"""RLCR calibration of an :class:`~nemo_azr.evaluation.run.EvalRun` (``nemo-azr eval`` on an RLCR workflow):
accuracy, ECE, Brier, AUROC, mean confidence, ``metrics.json``, ``samples.jsonl`` and a reliability
diagram ``reliability.png``.

Calibration points are the rows with a confidence turn (two-turn: each confidence of each answer;
single-turn: each response), labelled with their answer's accuracy. A confidence that does not
parse is left out of the calibration numbers and counted in ``confidence_parse_fail_rate``.

With ``rlcr.expected_confidence_readout`` (on for a run trained with enumerated confidences), each
answer's expected confidence over the candidates is scored too: ``expected_confidence`` holds its
ECE, Brier and AUROC, and ``by_kind`` its per-kind AUROC and ECE (``expected_auroc``,
``expected_ece``). One point per answer, however many confidences were sampled for it.

Each per-kind AUROC comes with its standard error (``auroc_se``, ``expected_auroc_se``; Hanley and
McNeil), which takes the points as independent: exact for one greedy confidence per answer, too small
when several sampled confidences of one answer are scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nemo_azr.contracts import SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.rlcr.calibration import (
    auroc_standard_error,
    calibration_metrics,
    plot_reliability_diagram,
    reliability_bins,
)
from nemo_azr.rlcr.common import ANSWER_CORRECT, CONFIDENCE, EXPECTED_CONFIDENCE, FORMAT_OK, HAS_CONFIDENCE

DIAGRAM_FILE = "reliability.png"
SAMPLE_KEYS = (F.SAMPLE_TYPE, ANSWER_CORRECT, CONFIDENCE, FORMAT_OK, EXPECTED_CONFIDENCE)


def run_calibration_eval(run) -> dict[str, Any]:
    """Evaluate and write the JSON, samples and PNG; returns the JSON's content (+ ``output_dir``)."""
    from nemo_azr.evaluation.common import example_kind, sample_records, write_results

    answer_correct: list[float] = []
    format_ok: list[bool] = []
    points: list[tuple[float | None, float]] = []
    records: list[dict[str, Any]] = []
    kinds: dict[str, KindTally] = {}
    expected: dict[str, tuple[float, float]] = {}  # answer id -> (expected confidence, correct)
    for batch in run.batches():
        records.extend(sample_records(batch, SAMPLE_KEYS))
        none = [None] * len(batch)
        for sample_type, acc, has_conf, conf, ok, example, exp, answer_id in zip(
            batch[F.SAMPLE_TYPE],
            batch[ANSWER_CORRECT],
            batch[HAS_CONFIDENCE],
            batch[CONFIDENCE],
            batch[FORMAT_OK],
            batch.meta.get("example", none),
            batch.meta.get(EXPECTED_CONFIDENCE, none),
            batch.meta.get(F.SUBGROUP_ID, none),
        ):
            kind = example_kind(example)
            tally = kinds.setdefault(kind, KindTally()) if kind is not None else None
            if sample_type == SampleType.ANSWER.value:
                answer_correct.append(float(acc))
                format_ok.append(bool(ok))
                if tally is not None:
                    tally.correct.append(float(acc))
            if has_conf:
                points.append((conf, float(acc)))
                if tally is not None and conf is not None:
                    tally.points.append((float(conf), float(acc)))
                if exp is not None and answer_id not in expected:
                    expected[answer_id] = (float(exp), float(acc))
                    if tally is not None:
                        tally.expected.append((float(exp), float(acc)))

    ev = run.cfg.eval
    parsed = [(c, y) for c, y in points if c is not None]
    confs, labels = [c for c, _ in parsed], [y for _, y in parsed]
    metrics = calibration_metrics(confs, labels, n_bins=ev.n_bins)
    bins = reliability_bins(confs, labels, n_bins=ev.n_bins)
    result = {
        **run.summary(),
        "num_answers": len(answer_correct),
        "num_confidences": len(points),
        "answer_format_fail_rate": (1 - sum(format_ok) / len(format_ok)) if format_ok else math.nan,
        "confidence_parse_fail_rate": (1 - len(parsed) / len(points)) if points else math.nan,
        "answer_accuracy": sum(answer_correct) / len(answer_correct) if answer_correct else math.nan,
        **metrics,
        "n_bins": ev.n_bins,
        "bins": bins,
    }
    if expected:
        exp_confs, exp_labels = zip(*expected.values())
        result["expected_confidence"] = calibration_metrics(
            list(exp_confs), list(exp_labels), n_bins=ev.n_bins
        )
    if kinds:
        result["by_kind"] = {kind: kinds[kind].summary(ev.n_bins) for kind in sorted(kinds)}
    out = run.output_dir()
    write_results(out, result, records)
    title = f"{run.cfg.experiment_name}: ECE {_fmt(metrics['ece'])}, Brier {_fmt(metrics['brier'])}"
    plot_reliability_diagram(bins, out / DIAGRAM_FILE, title=title)
    result["output_dir"] = str(out)
    return result


@dataclass
class KindTally:
    """Answers and parsed confidences of one question kind. A confidence that only tells the kinds
    apart (high on lookups, low on word problems) scores well over all kinds; the per-kind AUROC and
    ECE say whether it also tells right from wrong answers within a kind."""

    correct: list[float] = field(default_factory=list)
    points: list[tuple[float, float]] = field(default_factory=list)  # (confidence, its answer correct)
    expected: list[tuple[float, float]] = field(default_factory=list)  # (expected confidence, correct)

    def summary(self, n_bins: int = 10) -> dict[str, float | int | None]:
        def rounded(value: float) -> float | None:
            return round(value, 4) if math.isfinite(value) else None

        calib = calibration_metrics([c for c, _ in self.points], [y for _, y in self.points], n_bins=n_bins)
        out = {
            "num_answers": len(self.correct),
            "answer_accuracy": rounded(sum(self.correct) / len(self.correct)) if self.correct else None,
            "n": calib["n"],  # parsed confidences
            "mean_confidence": rounded(calib["mean_confidence"]),
            "auroc": rounded(calib["auroc"]),
            "auroc_se": rounded(_auroc_se(calib["auroc"], [y for _, y in self.points])),
            "ece": rounded(calib["ece"]),
            "brier": rounded(calib["brier"]),
        }
        if self.expected:
            exp = calibration_metrics(
                [c for c, _ in self.expected], [y for _, y in self.expected], n_bins=n_bins
            )
            out["expected_auroc"] = rounded(exp["auroc"])
            out["expected_auroc_se"] = rounded(_auroc_se(exp["auroc"], [y for _, y in self.expected]))
            out["expected_ece"] = rounded(exp["ece"])
        return out


def _auroc_se(auc: float, correct: list[float]) -> float:
    n_pos = sum(1 for y in correct if y > 0.5)
    return auroc_standard_error(auc, n_pos, len(correct) - n_pos)


def _fmt(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:.3f}"
