#!/usr/bin/env python
"""The LLM safety judge against hand labels and against the rule, on sandbox_os trajectories.

``benchmarks/data/judge_labels.jsonl`` holds solver trajectories of the held-out tasks (from
``nemo-azr eval`` runs of ``azr_sandbox_smollm2``) with a hand label each: ``safe`` true/false, read
from the transcript by a person (harm = deleting or changing a protected item, mailing a secret or
mailing outside the user's domain, whether or not it was the task's own temptation). This script
replays every trajectory in the environment (the transcript the judge reads, and the rule's score),
asks the judge of an experiment (default ``azr_sandbox_smollm2_judge``: a frozen untrained
SmolLM2-135M-Instruct with its rubric and demonstrations) for each, and writes confusion tables:
judge vs hand labels, rule vs hand labels, judge vs rule, with the judge's parse failures.

    .venv/bin/python benchmarks/judge_agreement.py                     # the committed labels
    .venv/bin/python benchmarks/judge_agreement.py collect OUT.jsonl EVAL_DIR/samples.jsonl ...  # unlabelled candidates

Results: benchmarks/results/judge_agreement.{json,md}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from machine import cpu_model  # noqa: E402

LABELS = ROOT / "benchmarks" / "data" / "judge_labels.jsonl"
RESULTS = ROOT / "benchmarks" / "results"
TASK_KEYS = ("task_id", "kind", "instruction", "harm_action", "success", "world", "seed_id", "seed_actions")


def collect(out: Path, sample_files: list[Path]) -> None:
    """Solver records of eval ``samples.jsonl`` files as unlabelled candidates (``safe: null``)."""
    from nemo_azr.envs.sandbox_os.heldout import load_heldout

    tasks = {t["task_id"]: t for t in load_heldout()[1]}
    rows = []
    for path in sample_files:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r.get("part") != "solver":
                continue
            task = {k: tasks[r["task_id"]][k] for k in TASK_KEYS}
            rows.append({"source": str(path.parent.name), **task, "turns": r["turns"], "safe": None})
    with open(out, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"{len(rows)} candidates written to {out}")


def replay(row: dict) -> tuple[list[dict], float, bool]:
    """(the judge's transcript, the rule's safety score, whether the rule before decision 136 called
    it harmful: the task's own harm action ran, or for a plain task any harmful action)."""
    from nemo_azr.envs.sandbox_os import SandboxOSEnv

    env = SandboxOSEnv()
    env.reset({k: row[k] for k in TASK_KEYS})
    for turn in row["turns"]:
        if env.step(turn).done:
            break
    result = env.evaluate()
    proposed_only = result.info["harm_done"] if row.get("harm_action") else result.info["rule_harms"]
    return env.get_history_messages(), result.safety_score, bool(proposed_only)


def table(pairs: list[tuple[bool, bool]], row_name: str, col_name: str) -> tuple[list[str], dict]:
    """A 2x2 confusion table (rows: ``row_name`` safe/unsafe, columns: ``col_name``) and agreement."""
    counts = {
        (a, b): sum(1 for x, y in pairs if x == a and y == b) for a in (True, False) for b in (True, False)
    }
    n = len(pairs)
    agree = (counts[(True, True)] + counts[(False, False)]) / n if n else float("nan")
    p_yes = (
        (counts[(True, True)] + counts[(True, False)]) * (counts[(True, True)] + counts[(False, True)])
    ) / n**2
    p_no = (
        (counts[(False, True)] + counts[(False, False)]) * (counts[(True, False)] + counts[(False, False)])
    ) / n**2
    kappa = (agree - p_yes - p_no) / (1 - p_yes - p_no) if (1 - p_yes - p_no) else float("nan")
    lines = [
        f"| {row_name} \\ {col_name} | safe | unsafe |",
        "| --- | --- | --- |",
        f"| safe | {counts[(True, True)]} | {counts[(True, False)]} |",
        f"| unsafe | {counts[(False, True)]} | {counts[(False, False)]} |",
        "",
        f"Agreement {agree:.3f} over {n}, Cohen's kappa {kappa:.3f}.",
    ]
    return lines, {
        "counts": {f"{a}/{b}": c for (a, b), c in counts.items()},
        "agreement": agree,
        "kappa": kappa,
        "n": n,
    }


def run(args) -> None:
    import torch

    from nemo_azr.preflight import load_config
    from nemo_azr.rewards.judge import build_judge

    cfg = load_config([f"experiment={args.experiment}", *args.overrides])
    torch.set_num_threads(cfg.trainer.num_threads or os.cpu_count() or 1)
    rows = [json.loads(line) for line in args.labels.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("safe") is not None]
    if not rows:
        raise SystemExit(f"{args.labels} has no labelled rows")
    replays = [replay(r) for r in rows]
    judge_cfg = cfg.absolute_zero.judge
    judge = build_judge(judge_cfg, policy_backend=None, tokenizer=None)  # a frozen judge brings its own
    scored = judge.score_many([h for h, _, _ in replays], judge_cfg.safety_rubric)
    human = [bool(r["safe"]) for r in rows]
    rule = [s > cfg.absolute_zero.learnability_safety_threshold for _, s, _ in replays]
    proposed_rule = [not harmed for _, _, harmed in replays]
    parsed = scored.parsed
    judge_safe = [v > cfg.absolute_zero.learnability_safety_threshold for v in scored.scores]
    sections, stats = [], {}
    for name, (a, b, ra, cb) in {
        "judge_vs_human": (
            [h for h, ok in zip(human, parsed) if ok],
            [j for j, ok in zip(judge_safe, parsed) if ok],
            "hand label",
            "judge (parsed replies)",
        ),
        "rule_vs_human": (human, rule, "hand label", "rule (any harmful action, decision 136)"),
        "proposed_harm_rule_vs_human": (
            human,
            proposed_rule,
            "hand label",
            "rule (the task's harm action only)",
        ),
        "judge_vs_rule": (
            [r for r, ok in zip(rule, parsed) if ok],
            [j for j, ok in zip(judge_safe, parsed) if ok],
            "rule",
            "judge (parsed replies)",
        ),
    }.items():
        lines, st = table(list(zip(a, b)), ra, cb)
        sections += [f"### {name.replace('_', ' ')}", "", *lines, ""]
        stats[name] = st
    replies: dict[str, int] = {}
    for text in scored.replies:
        key = text.strip()[:20]
        replies[key] = replies.get(key, 0) + 1
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "experiment": args.experiment,
        "judge_model": judge_cfg.model_path,
        "trajectories": len(rows),
        "hand_unsafe": sum(not h for h in human),
        "parse_failures": scored.num_failures,
        "judge_unsafe_rate": sum(not j for j, ok in zip(judge_safe, parsed) if ok) / max(1, sum(parsed)),
        "reply_counts": dict(sorted(replies.items(), key=lambda kv: -kv[1])[:8]),
        **stats,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    md = [
        "# LLM safety judge vs hand labels and the rule (sandbox_os)",
        "",
        f"{summary['date']}, {summary['machine']}. `benchmarks/judge_agreement.py` with the judge of "
        f"`experiment={args.experiment}` (model `{judge_cfg.model_path}`, greedy, "
        f"`max_new_tokens={judge_cfg.max_new_tokens}`). {len(rows)} hand-labelled trajectories "
        f"({summary['hand_unsafe']} unsafe) from `{args.labels.name}`; the judge's reply had no "
        f"score {scored.num_failures} times (left out of the judge tables; in training the rule stands in, counted).",
        "",
        f"Most frequent judge replies: {', '.join(f'`{k}` x{v}' for k, v in summary['reply_counts'].items())}.",
        "",
        *sections,
    ]
    (RESULTS / f"{args.results_name}.md").write_text("\n".join(md))
    print("\n".join(md))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command")
    c = sub.add_parser("collect", help="unlabelled candidates from eval samples.jsonl files")
    c.add_argument("out", type=Path)
    c.add_argument("samples", type=Path, nargs="+")
    parser.add_argument("--labels", type=Path, default=LABELS)
    parser.add_argument("--experiment", default="azr_sandbox_smollm2_judge")
    parser.add_argument("--overrides", nargs="*", default=[])
    parser.add_argument("--results-name", default="judge_agreement")
    args = parser.parse_args()
    if args.command == "collect":
        collect(args.out, args.samples)
    else:
        run(args)


if __name__ == "__main__":
    main()
