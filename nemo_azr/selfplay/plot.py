"""Plot of a self-play run over steps (from metrics.jsonl): learnable ratios, proposer reward, and the
proposer's parse rate with the solver's safety and completion."""

from __future__ import annotations

import json
from pathlib import Path

from nemo_azr.errors import DataError

ROLLING_WINDOW = 10
SERIES = {
    "unified_filter/learnable_ratio": "learnable ratio (final groups)",
    "unified_filter/initial_learnable_ratio": "learnable ratio (first proposals)",
    "proposer/reward_mean": "proposer reward",
    "proposer/valid_task_rate": "proposer parse rate",
    "harm/safety_score_mean": "solver safety",
    "harm/completion_score_mean": "solver completion",
}


def read_selfplay_series(metrics_file: Path) -> dict[str, list[tuple[int, float]]]:
    """``{metric: [(step, value), ...]}`` for the plotted metrics, in step order."""
    if not metrics_file.is_file():
        raise DataError(f"{metrics_file}: no such file; run training first (it writes metrics.jsonl)")
    series: dict[str, list[tuple[int, float]]] = {k: [] for k in SERIES}
    for line_no, line in enumerate(metrics_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{metrics_file}:{line_no}: not JSON ({exc})") from None
        for key in SERIES:
            if key in row:
                series[key].append((int(row["step"]), float(row[key])))
    if not series["unified_filter/learnable_ratio"]:
        raise DataError(f"{metrics_file} has no self-play metrics; was it written by an azr experiment?")
    return series


def rolling_mean(values: list[float], window: int = ROLLING_WINDOW) -> list[float]:
    """Mean of the last ``window`` values at each point (fewer at the start)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def _plot_with_mean(ax, points: list[tuple[int, float]], color: str, label: str) -> None:
    # Per-step values of a few prompts are noisy: thin raw line, thick rolling mean.
    steps, values = zip(*points)
    ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.8)
    ax.plot(
        steps,
        rolling_mean(list(values)),
        color=color,
        linewidth=2,
        label=f"{label} ({ROLLING_WINDOW}-step mean)",
    )


def plot_selfplay(metrics_file: Path, out_png: Path) -> dict[str, list[tuple[int, float]]]:
    """Three panels (learnable ratios; proposer reward; parse rate, safety, completion) saved to
    ``out_png``; returns the series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = read_selfplay_series(metrics_file)
    fig, (top, bottom, rates) = plt.subplots(3, 1, figsize=(6, 7.5), sharex=True)
    for key, color in (
        ("unified_filter/learnable_ratio", "tab:blue"),
        ("unified_filter/initial_learnable_ratio", "tab:orange"),
    ):
        if series[key]:
            _plot_with_mean(top, series[key], color, SERIES[key])
    top.set_ylabel("learnable ratio")
    top.set_ylim(-0.05, 1.05)
    top.legend(fontsize=8)
    if series["proposer/reward_mean"]:
        _plot_with_mean(bottom, series["proposer/reward_mean"], "tab:green", SERIES["proposer/reward_mean"])
        bottom.legend(fontsize=8)
    bottom.axhline(0.0, color="grey", linewidth=0.5)
    bottom.set_ylabel("proposer reward")
    for key, color in (
        ("proposer/valid_task_rate", "tab:purple"),
        ("harm/safety_score_mean", "tab:red"),
        ("harm/completion_score_mean", "tab:brown"),
    ):
        if series[key]:
            _plot_with_mean(rates, series[key], color, SERIES[key])
    rates.set_ylim(-0.05, 1.05)
    rates.set_ylabel("rate")
    rates.legend(fontsize=8)
    rates.set_xlabel("step")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    plt.close(fig)
    return series
