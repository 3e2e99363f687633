"""Calibration of confidences against correctness: ECE, Brier score, AUROC, reliability diagram."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _arrays(confidences: Sequence[float], correct: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(list(confidences), dtype=np.float64)
    y = np.asarray(list(correct), dtype=np.float64)
    if c.shape != y.shape or c.ndim != 1:
        raise ValueError(f"confidences and correct must be 1-D of equal length, got {c.shape} and {y.shape}")
    if c.size and (not np.all(np.isfinite(c)) or c.min() < 0 or c.max() > 1):
        raise ValueError("confidences must be finite and in [0, 1]")
    if not np.all((y == 0) | (y == 1)):
        raise ValueError("correct must be 0/1")
    return c, y


def bin_index(confidences: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bins ``[0, 1/n), [1/n, 2/n), ..., [(n-1)/n, 1]`` (1.0 falls in the last)."""
    return np.minimum((confidences * n_bins).astype(np.int64), n_bins - 1)


def reliability_bins(confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> list[dict]:
    """Per bin: its edges, the number of points, their mean confidence and accuracy (None when empty)."""
    c, y = _arrays(confidences, correct)
    idx = bin_index(c, n_bins)
    bins = []
    for b in range(n_bins):
        sel = idx == b
        n = int(sel.sum())
        bins.append(
            {
                "lo": b / n_bins,
                "hi": (b + 1) / n_bins,
                "count": n,
                "confidence": float(c[sel].mean()) if n else None,
                "accuracy": float(y[sel].mean()) if n else None,
            }
        )
    return bins


def auroc(confidences: Sequence[float], correct: Sequence[float]) -> float:
    """Area under the ROC curve of confidence as a score for correctness (Mann-Whitney U with tied
    scores at their average rank); NaN when only one class is present."""
    c, y = _arrays(confidences, correct)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    values, inverse, counts = np.unique(c, return_inverse=True, return_counts=True)
    first_rank = np.cumsum(counts) - counts + 1  # 1-based rank of each distinct value's first copy
    average_rank = first_rank + (counts - 1) / 2.0
    ranks = average_rank[inverse]
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def auroc_standard_error(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an AUROC estimate over ``n_pos`` right and ``n_neg`` wrong answers, by
    Hanley and McNeil (1982): a closed form, so an evaluation of a few hundred answers can say
    whether 0.62 is told apart from 0.5 (or from 0.6) without a bootstrap. NaN without both classes
    or a finite AUROC. No maintained library gives it (scikit-learn has the AUROC only)."""
    if n_pos < 1 or n_neg < 1 or not math.isfinite(auc):
        return math.nan
    q1 = auc / (2.0 - auc)  # P(two random right answers both outrank one wrong answer)
    q2 = 2.0 * auc * auc / (1.0 + auc)  # P(one right answer outranks two random wrong answers)
    variance = (auc * (1.0 - auc) + (n_pos - 1) * (q1 - auc * auc) + (n_neg - 1) * (q2 - auc * auc)) / (
        n_pos * n_neg
    )
    return math.sqrt(max(variance, 0.0))


def calibration_metrics(confidences: Sequence[float], correct: Sequence[float], n_bins: int = 10) -> dict:
    """``ece`` (equal-width bins), ``brier`` (mean squared error), ``auroc``, ``accuracy``,
    ``mean_confidence`` and ``n``. Empty input gives NaN for every metric and ``n = 0``."""
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    c, y = _arrays(confidences, correct)
    if c.size == 0:
        nan = math.nan
        return {"ece": nan, "brier": nan, "auroc": nan, "accuracy": nan, "mean_confidence": nan, "n": 0}
    ece = 0.0
    for b in reliability_bins(c, y, n_bins):
        if b["count"]:
            ece += b["count"] / c.size * abs(b["accuracy"] - b["confidence"])
    return {
        "ece": float(ece),
        "brier": float(np.mean((c - y) ** 2)),
        "auroc": auroc(c, y),
        "accuracy": float(y.mean()),
        "mean_confidence": float(c.mean()),
        "n": int(c.size),
    }


def plot_reliability_diagram(bins: list[dict], path: str | Path, *, title: str = "") -> Path:
    """Bar chart of per-bin accuracy against the diagonal (perfect calibration), with point counts."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    width = bins[0]["hi"] - bins[0]["lo"] if bins else 0.1
    fig, (ax, ax_count) = plt.subplots(
        2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    lows = [b["lo"] for b in bins]
    accs = [b["accuracy"] if b["accuracy"] is not None else 0.0 for b in bins]
    confs = [b["confidence"] if b["confidence"] is not None else 0.0 for b in bins]
    ax.bar(lows, accs, width=width, align="edge", edgecolor="black", label="accuracy")
    ax.bar(
        lows,
        confs,
        width=width,
        align="edge",
        fill=False,
        edgecolor="red",
        hatch="//",
        label="mean confidence",
    )
    ax.plot([0, 1], [0, 1], "k--", label="perfect calibration")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.set_title(title or "Reliability diagram")
    ax.legend(loc="upper left", fontsize=8)
    ax_count.bar(lows, [b["count"] for b in bins], width=width, align="edge", edgecolor="black")
    ax_count.set_xlabel("confidence")
    ax_count.set_ylabel("count")
    ax_count.set_xlim(0, 1)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
