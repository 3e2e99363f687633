#!/usr/bin/env python
"""Read an RLCR evaluation's samples by question kind and, for table lookups, by the asked row.

A two-turn RLCR model separates right from wrong answers within a kind only if something it can see
tells them apart. On the synthetic_qa lookups that something is the asked row: SmolLM2 answers the
last-listed value, so it is right on the last row and wrong on the others (docs/real_model.md). This
prints, for each evaluation folder (``nemo-azr eval`` output: ``samples.jsonl`` and ``metrics.json``),
per kind: answers, accuracy, within-kind AUROC (± its standard error, Hanley and McNeil) and over
how many parsed confidences it is taken, mean
confidence of right and wrong answers (and the expected confidence's AUROC where recorded); and per
lookup kind and asked row: answers, right, mean confidence (and the mean expected confidence over
the candidates where the evaluation recorded it, ``rlcr.expected_confidence_readout``). With
``--against UNTRAINED_EVAL`` it also counts the answers that are the untrained model's word for word
and gives, per kind, the within-kind AUROC over only those unchanged answers (written and expected
confidence): a separation there cannot come from answers the training moved. Last, per kind and
answer shape (one number the question lists, one number it does not, several numbers, no number, no
closed answer tag): answers, right, mean confidence. A confidence that only reads the shape ranks
lists and unlisted numbers (never right on a lookup) below listed ones; within the listed single
numbers it has to read the question.

    .venv/bin/python benchmarks/rlcr_rows.py outputs/real_model/rlcr_two_turn_smollm2/eval_before \\
        outputs/real_model/rlcr_two_turn_smollm2/eval_after
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from nemo_azr.rewards.answer_extraction import answer_tag, candidates
from nemo_azr.rlcr.calibration import auroc, auroc_standard_error
from nemo_azr.rlcr.common import ENUMERATED_FINISH

LOOKUPS = ("single_lookup", "pair_lookup", "table_lookup")
# "Ages: Dina 17, Fay 96. What is the age of Dina?": the listed names, then the asked one
_LIST = re.compile(r"^[^:]+:\s*(?P<items>[^.?]+)\.\s")
_ASKED = re.compile(r"of (?P<name>[\w ]+)\?\s*$")
SHAPES = ("listed number", "unlisted number", "several numbers", "no number", "no answer tag")


def asked_row(question: str) -> int | None:
    """1-based position of the asked name in the question's list, or None when it cannot be read."""
    items, asked = _LIST.match(question), _ASKED.search(question)
    if not items or not asked:
        return None
    names = [part.strip().rsplit(" ", 1)[0] for part in items.group("items").split(",")]
    name = asked.group("name").strip()
    return names.index(name) + 1 if name in names else None


def answer_shape(question: str, response: str) -> str:
    """What the reply's answer tag holds, against the numbers the question lists (one of ``SHAPES``),
    read with the reward's own tag and number readers. Distinct values count, so
    ``<answer>42 42</answer>`` is one number."""
    span = answer_tag(response)
    if span is None:
        return "no answer tag"
    numbers = candidates(span)
    if not numbers:
        return "no number"
    if len(numbers) > 1:
        return "several numbers"
    return "listed number" if numbers[0] in candidates(question) else "unlisted number"


def _group_cells(group: list[dict], has_expected: bool) -> str:
    """``answers | right | mean confidence |`` (and the mean expected confidence) of ``group``."""
    conf = [r["stated_confidence"] for r in group if r["stated_confidence"] is not None]
    exp = [r["expected_confidence"] for r in group if r["expected_confidence"] is not None]
    return f"{len(group)} | {sum(r['right'] for r in group)} | {_f(_mean(conf))} |" + (
        f" {_f(_mean(exp))} |" if has_expected else ""
    )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _with_se(value: float | None, n_pos: int, n_neg: int) -> str:
    """An AUROC with its standard error over ``n_pos`` right and ``n_neg`` wrong answers."""
    if value is None or value != value:
        return "n/a"
    se = auroc_standard_error(value, n_pos, n_neg)
    return f"{value:.3f}" if se != se else f"{value:.3f} ± {se:.3f}"


def _field_auroc(answers: list[dict], field: str) -> tuple[float | None, int, int]:
    """AUROC of ``field`` for being right over the answers that carry it (None when none do, NaN with
    one class), and how many of those are right and wrong."""
    scored = [r for r in answers if r[field] is not None]
    n_right = sum(r["right"] for r in scored)
    value = auroc([r[field] for r in scored], [float(r["right"]) for r in scored]) if scored else None
    return value, n_right, len(scored) - n_right


def rows(folder: Path) -> list[dict]:
    """Answer records joined with their confidence turn's parsed value (two turns) or carrying their
    own (single turn), and whether the answer is right."""
    records = [
        json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines() if line.strip()
    ]
    # an enumerated evaluation also logs each answer's candidate rows (confidence 0.0-1.0): they
    # are scored, not stated, so only the decoded confidence is joined
    turn2 = [
        r
        for r in records
        if r.get("sample_type") == "confidence" and r.get("finish_reason") != ENUMERATED_FINISH
    ]
    confidence = {r["prompt_id"]: r.get("confidence") for r in turn2}
    expected = {r["prompt_id"]: r.get("expected_confidence") for r in turn2}
    answers = [r for r in records if r.get("sample_type", "answer") == "answer"]
    for r in answers:
        # a single-turn reply states its confidence in the answer record itself
        r["stated_confidence"] = confidence.get(r["prompt_id"], r.get("confidence"))
        r["expected_confidence"] = expected.get(r["prompt_id"], r.get("expected_confidence"))
        # right by the answer check (the single turn's reward also holds format and Brier terms)
        r["right"] = float(r["answer_correct"]) > 0 if "answer_correct" in r else r["reward"] > 0
    return answers


def report(folder: Path) -> str:
    metrics = json.loads((folder / "metrics.json").read_text())
    answers = rows(folder)
    has_expected = any(r["expected_confidence"] is not None for r in answers)
    lines = [
        f"## {folder}",
        "",
        "| kind | answers | accuracy | AUROC | confidences parsed | confidence right | confidence wrong |"
        + (" expected AUROC |" * has_expected),
    ]
    lines.append("| --- | --- | --- | --- | --- | --- | --- |" + (" --- |" * has_expected))
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in answers:
        by_kind[r.get("kind", "?")].append(r)
    for kind, rs in sorted(by_kind.items()):
        right = [r["stated_confidence"] for r in rs if r["right"] and r["stated_confidence"] is not None]
        wrong = [r["stated_confidence"] for r in rs if not r["right"] and r["stated_confidence"] is not None]
        value = metrics.get("by_kind", {}).get(kind, {}).get("auroc")
        lines.append(
            f"| {kind} | {len(rs)} | {_f(_mean([float(r['right']) for r in rs]))} | "
            f"{_with_se(value, len(right), len(wrong))} | "
            f"{len(right) + len(wrong)} | {_f(_mean(right))} | {_f(_mean(wrong))} |"
            + (f" {_with_se(*_field_auroc(rs, 'expected_confidence'))} |" if has_expected else "")
        )
    lines += [
        "",
        "| kind | asked row | answers | right | mean confidence |"
        + (" mean expected confidence |" * has_expected),
        "| --- | --- | --- | --- | --- |" + (" --- |" * has_expected),
    ]
    for kind in LOOKUPS:
        by_row: dict[int | None, list[dict]] = defaultdict(list)
        for r in by_kind.get(kind, []):
            by_row[asked_row(r["question"])].append(r)
        for row in sorted(by_row, key=lambda x: (x is None, x or 0)):
            lines.append(
                f"| {kind} | {row if row is not None else '?'} | {_group_cells(by_row[row], has_expected)}"
            )
    lines += [
        "",
        "| kind | answer shape | answers | right | mean confidence |"
        + (" mean expected confidence |" * has_expected),
        "| --- | --- | --- | --- | --- |" + (" --- |" * has_expected),
    ]
    for kind, rs in sorted(by_kind.items()):
        by_shape: dict[str, list[dict]] = defaultdict(list)
        for r in rs:
            by_shape[answer_shape(r["question"], r.get("response", ""))].append(r)
        for shape in (s for s in SHAPES if s in by_shape):
            lines.append(f"| {kind} | {shape} | {_group_cells(by_shape[shape], has_expected)}")
    return "\n".join(lines) + "\n"


def answer_changes(reference: Path, folder: Path) -> dict[str, int]:
    """How the answers of ``folder`` differ from those of ``reference`` (the untrained model's
    evaluation on the same questions), matched by prompt id: ``same`` (the reply word for word),
    ``lost`` (right there, not here), ``gained`` and ``compared``. The two-turn runs' answers are not
    trained; this counts how far the confidence turn moved them through the shared weights."""
    before = {r["prompt_id"]: r for r in rows(reference)}
    pairs = [(before[r["prompt_id"]], r) for r in rows(folder) if r["prompt_id"] in before]
    return {
        "compared": len(pairs),
        "same": sum(b["response"] == a["response"] for b, a in pairs),
        "lost": sum(b["right"] and not a["right"] for b, a in pairs),
        "gained": sum(a["right"] and not b["right"] for b, a in pairs),
    }


def unchanged_auroc(reference: Path, folder: Path) -> dict[str, dict[str, float | int | None]]:
    """Per kind, over the answers of ``folder`` that are word for word those of ``reference``: their
    count ``n`` and the AUROC of the written (``stated``) and the ``expected`` confidence for being
    right (None where one class is missing or no value was recorded), and how many of them are ``right``."""
    before = {r["prompt_id"]: r["response"] for r in rows(reference)}
    by_kind: dict[str, list[dict]] = defaultdict(list)
    for r in rows(folder):
        if before.get(r["prompt_id"]) == r["response"]:
            by_kind[r.get("kind", "?")].append(r)
    out: dict[str, dict[str, float | int | None]] = {}
    for kind, rs in sorted(by_kind.items()):
        out[kind] = {"n": len(rs), "right": sum(r["right"] for r in rs)}
        for key, field in (("stated", "stated_confidence"), ("expected", "expected_confidence")):
            value, _, _ = _field_auroc(rs, field)
            out[kind][key] = None if value is None or value != value else value  # NaN: one class only
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path, help="nemo-azr eval output folders")
    parser.add_argument(
        "--against", type=Path, default=None,
        help="an evaluation of the untrained model on the same questions: also count each folder's "
        "answers that are word for word the same, right answers lost and gained",
    )  # fmt: skip
    args = parser.parse_args()
    for folder in [*args.folders, *([args.against] if args.against else [])]:
        missing = [n for n in ("metrics.json", "samples.jsonl") if not (folder / n).is_file()]
        if missing:  # an evaluation still running, or not an eval folder: say so, not a traceback
            parser.error(f"{folder} has no {' or '.join(missing)} (is its nemo-azr eval finished?)")
    for folder in args.folders:
        print(report(folder))
        if args.against is not None:
            c = answer_changes(args.against, folder)
            print(
                f"answers against {args.against}: {c['same']} of {c['compared']} the same, "
                f"{c['lost']} right answers lost, {c['gained']} gained"
            )
            for kind, u in unchanged_auroc(args.against, folder).items():
                print(
                    f"  {kind}: within-kind AUROC over its {u['n']} unchanged answers ({u['right']} "
                    f"right): written {_with_se(u['stated'], u['right'], u['n'] - u['right'])}, "
                    f"expected {_with_se(u['expected'], u['right'], u['n'] - u['right'])}"
                )
            print()


if __name__ == "__main__":
    main()
