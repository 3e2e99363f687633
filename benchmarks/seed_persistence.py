"""Does a seed goal's first-pass band share repeat from one proposal to the next?

    python benchmarks/seed_persistence.py "step_0=outputs/RUN/eval_fixed_warmed_up" "step 40=outputs/RUN/eval_fixed_step_40"

Each argument is ``LABEL=DIR``, a fixed-solver proposer evaluation (``nemo-azr eval
experiment=azr_sandbox_smollm2 eval.selfplay_solver=false eval.selfplay_proposals_per_seed=N``), whose
``samples.jsonl`` holds N proposals per held-out seed. A proposal's share is the share of its group's
questions in the band, 0 when it did not parse (what ``absolute_zero.curriculum_feedback=first_pass``
feeds the curriculum). A curriculum over seeds can only help where the share is a property of the seed,
so this prints, per evaluation: the split-half correlation across seeds (mean share of each seed's first
half of proposals against its second half) and a permutation test of the between-seed variance of the
mean shares (shares shuffled across seeds, seed sizes kept; p = share of shuffles at or above the
observed variance).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path


def seed_shares(samples: Path) -> dict[str, list[float]]:
    """Each seed's proposal shares, in the order written."""
    shares: dict[str, list[float]] = defaultdict(list)
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        if row.get("part") == "proposer":
            learnable = row.get("learnable") or []
            shares[row["seed_id"]].append(sum(learnable) / len(learnable) if learnable else 0.0)
    return dict(shares)


def between_seed_variance(shares: Mapping[str, Sequence[float]]) -> float:
    return statistics.pvariance([statistics.mean(v) for v in shares.values()])


def split_half_r(shares: Mapping[str, Sequence[float]]) -> float:
    """Pearson r across seeds of the first half's mean share against the second half's (nan if flat)."""
    halves = [(statistics.mean(v[: len(v) // 2]), statistics.mean(v[len(v) // 2 :])) for v in shares.values()]
    first, second = zip(*halves)
    if statistics.pstdev(first) == 0 or statistics.pstdev(second) == 0:
        return float("nan")
    return statistics.correlation(first, second)


def permutation_p(shares: Mapping[str, Sequence[float]], rounds: int = 2000, seed: int = 0) -> float:
    observed = between_seed_variance(shares)
    pooled = [x for v in shares.values() for x in v]
    sizes = [len(v) for v in shares.values()]
    rng, hits = random.Random(seed), 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        shuffled, start = {}, 0
        for i, n in enumerate(sizes):
            shuffled[i], start = pooled[start : start + n], start + n
        hits += between_seed_variance(shuffled) >= observed - 1e-12
    return hits / rounds


def table(evals: Sequence[tuple[str, Path]]) -> str:
    lines = [
        "| proposer | seeds | proposals | mean share | split-half r | between-seed variance | permutation p |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, folder in evals:
        shares = seed_shares(folder / "samples.jsonl")
        if not shares or min(len(v) for v in shares.values()) < 2:
            raise SystemExit(
                f"{folder}: needs two or more proposals per seed (eval.selfplay_proposals_per_seed)"
            )
        count = sum(len(v) for v in shares.values())
        mean = sum(x for v in shares.values() for x in v) / count
        lines.append(
            f"| {label} | {len(shares)} | {count} | {mean:.3f} | {split_half_r(shares):.2f} | "
            f"{between_seed_variance(shares):.4f} | {permutation_p(shares):.3f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("evals", nargs="+", help="LABEL=DIR")
    args = parser.parse_args(argv)
    evals = []
    for item in args.evals:
        label, sep, folder = item.partition("=")
        if not sep:
            raise SystemExit(f"expected LABEL=DIR, got {item!r}")
        evals.append((label, Path(folder)))
    print(table(evals))


if __name__ == "__main__":
    main()
