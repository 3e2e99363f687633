"""The held-out proposer of several checkpoints side by side, counted from their evaluations' samples.

    python benchmarks/selfplay_proposer_table.py step_0=outputs/run/eval_p0 step_40=outputs/run/eval_p40

Each argument is LABEL=DIR, DIR an ``nemo-azr eval`` output of a self-play run (its
``metrics.json`` and ``samples.jsonl``), typically proposer-only passes over a run's checkpoints
with one fixed solver (``eval.selfplay_solver=false eval.selfplay_fixed_solver=PATH``);
LABEL=DIR1,DIR2 pools the counts of several passes of one checkpoint (run with different ``seed``
values, so their proposals are independent samples) against the same solver. Prints a
markdown table: proposals, parsed groups, learnable questions of parsed groups with the ratio and
its binomial standard error, learnable questions of all asked for (a failed parse counts its
questions as not learnable), kept groups and the solver that judged them; then the change of the
learnable ratio from the first row to each later one with the standard error of that difference,
and the same for the learnable share of all questions asked for, so a rise is read against what
the number of proposals can resolve; and where the parsed questions fall against each half of the
band (safe share and incomplete share of the solver's answers inside [0.3, 0.7], or which side
they miss).

``--success-must-fit-seed`` re-reads every parsed proposal of a ``sandbox_os`` evaluation under
decision 196's rule (each success criterion must hold after the held-out seed goal's own benign
actions) and counts a group that breaks it as unparsed, so a run trained without the rule can be
compared with one trained under it on the same terms.

``--by-goal`` adds, per checkpoint, the parsed questions by the held-out seed goal's family (the
goal's first word: Mail, Copy, ...): how many, the share no solver answer completed at all
(completion 0: outside the band's incomplete half whatever the temptation), and the learnable
ratio. A family the solver never completes gives the solver nothing to learn in self-play.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nemo_azr.evaluation.selfplay import goal_verb

BAND = (0.3, 0.7)  # the experiments' learnability band, on both the safe and the incomplete share
BAND_SIDES = (
    "safe in band",
    "too safe",
    "too unsafe",
    "incomplete in band",
    "too complete",
    "too incomplete",
)


@dataclass
class ProposerCounts:
    label: str
    proposals: int
    parsed: int
    questions: int  # questions of the parsed groups
    asked: int  # questions asked for: every proposal's questions_per_group, parsed or not
    learnable: int
    kept: int  # groups the filter would keep (not re-proposed)
    solved_by: str
    # parsed questions by where they fall against each half of the band (BAND_SIDES)
    band_sides: Counter = field(default_factory=Counter)
    # per seed goal family: Counter(questions=, never_completed=, learnable=) of the parsed questions
    families: dict[str, Counter] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return _share(self.learnable, self.questions)

    @property
    def ratio_se(self) -> float:
        """Binomial standard error of the learnable ratio (questions taken as independent)."""
        return _binomial_se(self.learnable, self.questions)

    @property
    def asked_ratio(self) -> float:
        return _share(self.learnable, self.asked)

    @property
    def asked_ratio_se(self) -> float:
        return _binomial_se(self.learnable, self.asked)


def _share(k: int, n: int) -> float:
    return k / n if n else 0.0


def _binomial_se(k: int, n: int) -> float:
    p = _share(k, n)
    return math.sqrt(p * (1 - p) / n) if n else 0.0


def band_sides(safe_share: float, complete_share: float, band: tuple[float, float] = BAND) -> list[str]:
    """Where one question falls against each half of the band: its safe share of the solver's
    answers, and its incomplete share (1 - the complete share), both inclusive at the edges as the
    learnability filter counts them (``nemo_azr.selfplay.learnability``, which reads per-answer
    scores; the eval's samples keep only the shares)."""
    low, high = band
    incomplete = 1.0 - complete_share
    sides = ["too safe" if safe_share > high else "too unsafe" if safe_share < low else "safe in band"]
    sides.append(
        "too incomplete"
        if incomplete > high
        else "too complete"
        if incomplete < low
        else "incomplete in band"
    )
    return sides


def fits_seed_goals() -> Callable[[dict], bool]:
    """Whether a parsed held-out ``sandbox_os`` proposal record passes decision 196's rule."""
    from nemo_azr.config.schema import AbsoluteZeroConfig, SandboxOSConfig
    from nemo_azr.envs.base import ProposalError
    from nemo_azr.envs.sandbox_os import SandboxOSDomain

    domain = SandboxOSDomain(AbsoluteZeroConfig(sandbox_os=SandboxOSConfig(success_must_fit_seed=True)))
    seeds = {s.prompt_id: s for s in domain.heldout_seeds()}

    def fits(record: dict) -> bool:
        seed = seeds.get(record.get("seed_id", ""))
        if seed is None:
            raise SystemExit(
                f"--success-must-fit-seed: {record.get('seed_id')!r} is no held-out sandbox_os goal"
            )
        try:
            domain.parse_proposal(record["proposal"], seed, int(record["num_questions"]))
        except ProposalError:
            return False
        return True

    return fits


def count_proposals(label: str, folder: Path, keep: Callable[[dict], bool] | None = None) -> ProposerCounts:
    """The counts of one evaluation; ``keep``: a parsed record it rejects counts as unparsed."""
    metrics = json.loads((folder / "metrics.json").read_text())
    records = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x.strip()]
    proposals = [r for r in records if r.get("part") == "proposer"]
    if not proposals:
        raise SystemExit(f"{folder}: no proposer records (was eval.selfplay_proposals_per_seed 0?)")
    if keep is not None:
        proposals = [r if not r["parsed"] or keep(r) else {**r, "parsed": False, "status": "repropose"}
                     for r in proposals]  # fmt: skip
    parsed = [r for r in proposals if r["parsed"]]
    sides = Counter(
        side
        for r in parsed
        for safe, complete in zip(r.get("safety", []), r.get("completion", []))
        for side in band_sides(safe, complete)
    )
    families: dict[str, Counter] = {}
    for r in parsed:
        family = families.setdefault(goal_family(r), Counter())
        for learnable, complete in zip(r["learnable"], r.get("completion", [])):
            family.update(questions=1, never_completed=int(complete == 0), learnable=int(bool(learnable)))
    return ProposerCounts(
        label=label,
        proposals=len(proposals),
        parsed=len(parsed),
        questions=sum(len(r["learnable"]) for r in parsed),
        asked=sum(int(r["num_questions"]) for r in proposals),
        learnable=sum(sum(map(bool, r["learnable"])) for r in parsed),
        kept=sum(r["status"] != "repropose" for r in proposals),
        solved_by=str(metrics.get("proposer_questions_solved_by", metrics.get("checkpoint", ""))),
        band_sides=sides,
        families=families,
    )


def goal_family(record: dict) -> str:
    """The seed goal's first word ("Mail notes.txt to bob@corp.com." -> "Mail"), as the eval's
    ``solver.by_goal_verb`` reads a task's instruction."""
    seed = str(record.get("seed", ""))
    return goal_verb(seed) if seed.split() else "(none)"


def pooled(label: str, parts: list[ProposerCounts]) -> ProposerCounts:
    """One row from several passes of the same checkpoint against the same solver: counts added."""
    solvers = {p.solved_by for p in parts}
    if len(solvers) > 1:
        raise SystemExit(
            f"{label}: its passes were solved by different models ({sorted(solvers)}); pool only one solver's"
        )
    return ProposerCounts(
        label=label,
        proposals=sum(p.proposals for p in parts),
        parsed=sum(p.parsed for p in parts),
        questions=sum(p.questions for p in parts),
        asked=sum(p.asked for p in parts),
        learnable=sum(p.learnable for p in parts),
        kept=sum(p.kept for p in parts),
        solved_by=parts[0].solved_by,
        band_sides=sum((p.band_sides for p in parts), Counter()),
        families={
            name: sum((p.families.get(name, Counter()) for p in parts), Counter())
            for name in sorted({n for p in parts for n in p.families})
        },
    )


def difference_with_error(a: ProposerCounts, b: ProposerCounts) -> tuple[float, float]:
    """b's learnable ratio minus a's, and the standard error of the difference (independent samples)."""
    return _difference(a.learnable, a.questions, b.learnable, b.questions)


def asked_difference_with_error(a: ProposerCounts, b: ProposerCounts) -> tuple[float, float]:
    """The same for the learnable share of all questions asked for."""
    return _difference(a.learnable, a.asked, b.learnable, b.asked)


def _difference(ka: int, na: int, kb: int, nb: int) -> tuple[float, float]:
    return _share(kb, nb) - _share(ka, na), math.sqrt(_binomial_se(ka, na) ** 2 + _binomial_se(kb, nb) ** 2)


def step_of(label: str) -> int:
    """The training step a row's label names (its last number: ``step_24``, ``step_24 (pooled)``)."""
    numbers = re.findall(r"\d+", label)
    if not numbers:
        raise SystemExit(f"--slope: label {label!r} names no step; write e.g. step_24=DIR")
    return int(numbers[-1])


def slopes(rows: list[ProposerCounts]) -> dict[str, tuple[float, float]]:
    """Least-squares slope over the steps, per 10 steps, with its standard error, of whether a parsed
    question is learnable and of whether an asked-for question is: one 0/1 point per question, so
    each checkpoint weighs by its number of questions."""
    from selfplay_windows import slope_with_error

    out = {}
    for name, total in (("first-pass learnable", "questions"), ("learnable / asked", "asked")):
        xs = [float(step_of(r.label)) for r in rows for _ in range(getattr(r, total))]
        ys = [1.0 if i < r.learnable else 0.0 for r in rows for i in range(getattr(r, total))]
        slope, se = slope_with_error(xs, ys)
        out[name] = (10 * slope, 10 * se)
    return out


def table(rows: list[ProposerCounts]) -> str:
    lines = [
        "| checkpoint | proposals | parse rate | learnable / questions | first-pass learnable (± SE) "
        "| learnable / asked | kept groups | questions solved by |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.label} | {r.proposals} | {r.parsed / r.proposals:.3f} | {r.learnable} / {r.questions} "
            f"| {r.ratio:.3f} ± {r.ratio_se:.3f} | {r.asked_ratio:.3f} | {r.kept} | {Path(r.solved_by).name or r.solved_by} |"
        )
    lines += ["", f"Where the parsed questions fall against each half of the band {list(BAND)} (shares):", "",
              "| checkpoint | " + " | ".join(BAND_SIDES) + " |", "|" + " --- |" * (len(BAND_SIDES) + 1)]  # fmt: skip
    for r in rows:
        shares = [r.band_sides[side] / r.questions if r.questions else 0.0 for side in BAND_SIDES]
        lines.append(f"| {r.label} | " + " | ".join(f"{x:.3f}" for x in shares) + " |")
    first = rows[0]
    for r in rows[1:]:
        diff, se = difference_with_error(first, r)
        asked, asked_se = asked_difference_with_error(first, r)
        lines.append(
            f"\n{r.label} - {first.label}: {diff:+.3f} ± {se:.3f} first-pass learnable, "
            f"{asked:+.3f} ± {asked_se:.3f} learnable / asked"
        )
    return "\n".join(lines)


def family_table(rows: list[ProposerCounts]) -> str:
    """Parsed questions by seed goal family (``--by-goal``)."""
    lines = [
        "Parsed questions by the held-out seed goal's family:",
        "",
        "| checkpoint | goal family | questions | no answer completed | learnable |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        for name, c in sorted(r.families.items()):
            n = c["questions"]
            lines.append(
                f"| {r.label} | {name} | {n} | {_share(c['never_completed'], n):.2f} "
                f"| {c['learnable']} ({_share(c['learnable'], n):.3f}) |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "evals", nargs="+", help="LABEL=DIR or LABEL=DIR1,DIR2 (pooled), DIR an nemo-azr eval output folder"
    )
    parser.add_argument(
        "--slope", action="store_true", help="also the least-squares slope over the steps the labels name"
    )
    parser.add_argument(
        "--success-must-fit-seed",
        action="store_true",
        help="count a parsed group whose success criteria break decision 196's rule as unparsed",
    )
    parser.add_argument(
        "--by-goal", action="store_true", help="also the parsed questions by seed goal family"
    )
    args = parser.parse_args()
    keep = fits_seed_goals() if args.success_must_fit_seed else None
    rows = []
    for item in args.evals:
        label, sep, folders = item.partition("=")
        if not sep or not folders:
            raise SystemExit(f"{item!r}: write LABEL=DIR or LABEL=DIR1,DIR2")
        parts = [count_proposals(label, Path(folder), keep) for folder in folders.split(",")]
        rows.append(parts[0] if len(parts) == 1 else pooled(label, parts))
    print(table(rows))
    if args.by_goal:
        print("\n" + family_table(rows))
    if args.slope:
        for name, (slope, se) in slopes(rows).items():
            if math.isnan(slope):
                print(f"\nslope of {name}: none (it needs questions at two or more checkpoints)")
            else:
                print(f"\nslope of {name}: {slope:+.4f} ± {se:.4f} per 10 steps")


if __name__ == "__main__":
    main()
