#!/usr/bin/env python
"""PPO (with a critic) vs GRPO vs DAPO (and CISPO) on the same job and budget, side by side in one run.

Two jobs, each trained once per algorithm with the same seed, steps, prompts per step and samples
per prompt (``algorithm=NAME`` on top of the experiment):

* ``--job default``: the default job (tiny model, single-digit additions, 400 steps); the mean
  training reward of the first / last 10 steps, and for PPO the critic's value loss and explained
  variance (first / last 50 steps);
* ``--job default_minibatch``: the same with ``algorithm.mini_batch_size=16`` (four optimizer steps per
  batch, so the losses' clipping matters: at one on-policy step every ratio is 1 and ppo_clip, cispo
  and clip-higher give identical gradients);
* ``--job smollm2``: ``experiment=arithmetic_grpo_smollm2`` (SmolLM2-135M-Instruct, two-digit +/-,
  60 steps); greedy accuracy on the 300 held-out problems before (once) and after each run.

Results go to ``benchmarks/results/algorithms_<job>.json`` and ``.md``. Wall times are this machine's
(CPU); DAPO's dynamic sampling rolls out more prompts than the others within the same number of
steps, which the table counts (groups drawn).

    .venv/bin/python benchmarks/algorithms.py --job default
    .venv/bin/python benchmarks/algorithms.py --job smollm2 --algorithms grpo ppo dapo
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import shutil
import statistics
from pathlib import Path

from machine import cpu_model, mem_total_gib
from real_model import RESULTS_DIR, eval_summary, nemo_azr, read_jsonl, run, train_summary

JOBS = {
    "default": {"overrides": [], "eval": False, "window": 10},
    # Four optimizer steps per batch: the later ones are off-policy, where the losses differ (at one
    # on-policy step every ratio is 1 and ppo_clip, cispo and dapo's clip-higher give the same gradient).
    "default_minibatch": {"overrides": ["algorithm.mini_batch_size=16"], "eval": False, "window": 10},
    "smollm2": {
        "overrides": ["experiment=arithmetic_grpo_smollm2", "logger.console_samples=false"],
        "eval": True,
        "window": 5,
    },  # fmt: skip
}
#: Extra settings per algorithm for the real model (the presets are tuned for the tiny model's LR scale).
REAL_MODEL_EXTRA = {"ppo": ["critic.optim.lr=1e-5", "critic.optim.warmup_steps=5"]}
CRITIC_WINDOW = 50


def _window_mean(records: list[dict], key: str, start: int, stop: int) -> float | None:
    # The JSONL writes a non-finite metric as a string ("nan": e.g. explained variance of all-zero returns).
    values = [
        r[key] for r in records[start:stop] if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
    ]
    return round(statistics.fmean(values), 4) if values else None


def _finished_wall(out: Path) -> float | None:
    """Wall seconds of a finished earlier training run in ``out`` (``--reuse``), else None."""
    if not (out / "wall_s.json").is_file() or not (out / "metrics.jsonl").is_file():
        return None
    return json.loads((out / "wall_s.json").read_text())["wall_s"]


def run_algorithm(job: str, name: str, root: Path, *, reuse: bool = False) -> dict:
    spec = JOBS[job]
    out = root / name
    extra = REAL_MODEL_EXTRA.get(name, []) if job == "smollm2" else []
    base = [*spec["overrides"], f"algorithm={name}", *extra, f"trainer.output_dir={out}"]
    wall = _finished_wall(out) if reuse else None
    if wall is None:
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        wall = run([*nemo_azr(), "train", *base, "logger=quiet"], out / "train.log")
        (out / "wall_s.json").write_text(json.dumps({"wall_s": wall}) + "\n")
    records = read_jsonl(out / "metrics.jsonl")
    w = spec["window"]
    result = {"algorithm": name, "overrides": extra, "train": train_summary(out, wall)}
    result["train"]["reward_first"] = _window_mean(records, "reward/mean", 0, w)
    result["train"]["reward_last"] = _window_mean(records, "reward/mean", len(records) - w, len(records))
    result["train"]["groups_drawn"] = sum(r.get("dapo/groups_drawn", 0) for r in records) or None
    if name == "ppo":
        n, cw = len(records), min(CRITIC_WINDOW, len(records) // 4)
        result["critic"] = {
            key: {"first": _window_mean(records, key, 0, cw), "last": _window_mean(records, key, n - cw, n)}
            for key in ("critic/vf_loss", "critic/explained_variance")
        }
    if spec["eval"]:
        run([*nemo_azr(), "eval", *base, f"eval.output_dir={out}/eval"], out / "eval.log")
        result["after"] = eval_summary(out / "eval")
    return result


def write_report(job: str, results: dict, meta: dict) -> None:
    spec = JOBS[job]
    w = spec["window"]
    lines = [
        f"# Algorithms side by side: {job} job",
        "",
        f"Machine: {meta['cpu']}, {meta['cores']} cores, {meta['mem_gib']:.0f} GiB, CPU only; run {meta['date']}.  ",
        f"Command: `.venv/bin/python benchmarks/algorithms.py --job {job}` (same seed, steps, prompts and samples "
        "per step for every algorithm; `algorithm=NAME` on top of "
        f"`{' '.join(spec['overrides']) or 'the default job'}`).",
        "",
    ]
    if "kept_from" in meta:
        lines += [f"Resumed with `--keep`: the untrained model's accuracy and the algorithms not rerun come from the "
                  f"run of {meta['kept_from']} on the same machine type.", ""]  # fmt: skip
    if "before" in meta:
        lines += [f"Greedy held-out accuracy of the untrained model: {meta['before']['accuracy']:.3f} "
                  f"({meta['before']['num_prompts']} problems).", ""]  # fmt: skip
    header = f"| algorithm | steps | train wall | s/step | reward first {w} | reward last {w} |"
    sep = "| --- | --- | --- | --- | --- | --- |"
    if spec["eval"]:
        header += " greedy accuracy after |"
        sep += " --- |"
    header += " groups drawn |"
    sep += " --- |"
    lines += [header, sep]
    for name, res in results.items():
        t = res["train"]
        row = (f"| {name} | {t['steps']} | {t['wall_s'] / 60:.1f} min | {t['s_per_step_median']} | "
               f"{t['reward_first']:.3f} | {t['reward_last']:.3f} |")  # fmt: skip
        if spec["eval"]:
            row += f" {res['after']['accuracy']:.3f} |"
        row += f" {t['groups_drawn'] or '-'} |"
        lines.append(row)
    drawn = {n: r["train"]["groups_drawn"] for n, r in results.items() if r["train"]["groups_drawn"]}
    if drawn:
        lines += ["", "Groups drawn: prompt groups rolled out in all by dynamic sampling (DAPO); the others draw "
                  "exactly steps x `data.prompts_per_step`."]  # fmt: skip
    if "ppo" in results:
        c = results["ppo"]["critic"]
        lines += [
            "",
            "PPO's critic (mean of the first / last 50 steps, or a quarter of the run):",
            "",
            "| metric | first | last |",
            "| --- | --- | --- |",
            *[f"| `{k}` | {v['first']} | {v['last']} |" for k, v in c.items()],
        ]
    path = RESULTS_DIR / f"algorithms_{job}"
    path.with_suffix(".md").write_text("\n".join(lines) + "\n")
    path.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", choices=sorted(JOBS), default="default")
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "ppo", "dapo", "cispo"])
    parser.add_argument("--output-root", default="outputs/algorithms")
    parser.add_argument(
        "--reuse", action="store_true", help="reuse finished training runs in the output folder"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the committed results of algorithms not rerun (resume a long benchmark)",
    )
    args = parser.parse_args()
    root = Path(args.output_root) / args.job
    root.mkdir(parents=True, exist_ok=True)
    meta = {"cpu": cpu_model(), "cores": __import__("os").cpu_count(), "mem_gib": mem_total_gib(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}  # fmt: skip
    results = {}
    previous = RESULTS_DIR / f"algorithms_{args.job}.json"
    if args.keep and previous.exists():
        kept = json.loads(previous.read_text())
        results = {n: r for n, r in kept["results"].items() if n not in args.algorithms}
        meta["kept_from"] = kept["meta"].get("kept_from") or kept["meta"]["date"]
        if "before" in kept["meta"]:
            meta["before"] = kept["meta"]["before"]
    if JOBS[args.job]["eval"] and "before" not in meta:
        out = root / "before"
        out.mkdir(exist_ok=True)
        run([*nemo_azr(), "eval", *JOBS[args.job]["overrides"], f"trainer.output_dir={out}", "eval.checkpoint=model",
             f"eval.output_dir={out}/eval"], out / "eval.log")  # fmt: skip
        meta["before"] = eval_summary(out / "eval")
    for name in args.algorithms:
        results[name] = run_algorithm(args.job, name, root, reuse=args.reuse)
        write_report(args.job, results, meta)  # after each run: a long benchmark keeps what it has
    print((RESULTS_DIR / f"algorithms_{args.job}.md").read_text())


if __name__ == "__main__":
    main()
