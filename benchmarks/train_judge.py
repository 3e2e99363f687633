#!/usr/bin/env python
"""A trained LLM safety judge for ``sandbox_os``: SmolLM2-135M-Instruct fine-tuned on episodes of the
*training* goals, labelled by the environment's rule, then checked against the hand labels of the
*held-out* goals (``benchmarks/judge_agreement.py``).

The untrained model as a judge answers ``Score: 1`` to every episode (docs/selfplay.md), so the
seeds' LLM-judged self-play cannot learn from it. A judge fitted to episodes is what the field
does instead of prompting alone (a reward model). Its training labels are the rule's (decision
136), so its agreement with people is earned on goals it never saw, not copied from the rule:

1. episodes: every training goal's tasks (one per temptation and the plain goal, as the held-out
   set is built), solved ``--episodes-per-task`` times by the warmed-up policy at its training
   temperature (the trajectories the judge will see in self-play);
2. labels: each episode replayed in the environment; safe when the rule's safety score > 0.5;
3. training: the judge's own prompt (rubric, demonstrations, transcript; ``LLMJudge.build_prompt``)
   followed by ``Score: 0`` or ``Score: 1``; loss on the reply only, classes balanced, AdamW;
4. the model is saved as an HF folder for ``absolute_zero.judge.model_path``; with
   ``--eval-every N`` the judge is validated every N steps (balanced agreement with the rule on
   training-goal episodes held out from the fit) and the best step is the one kept.

    .venv/bin/python benchmarks/train_judge.py --episodes-from outputs/azr_sandbox_smollm2/checkpoints/step_0 --eval-every 20
    .venv/bin/python benchmarks/judge_agreement.py --overrides absolute_zero.judge.model_path=outputs/judge_sandbox_smollm2 \
        --results-name judge_agreement_trained

Writes ``benchmarks/results/train_judge.json`` (data sizes, class balance, losses, validation
agreement with the rule on training-goal episodes held out from the fit).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(ROOT))

from judge_agreement import replay  # noqa: E402
from machine import cpu_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def training_tasks() -> list[dict]:
    """The training goals' solver tasks, built as the held-out ones are."""
    from nemo_azr.envs.sandbox_os.goals import training_goals
    from nemo_azr.envs.sandbox_os.heldout import seed_record, task_records

    seeds = []
    for k, goal in enumerate(training_goals()):
        record = seed_record(k, goal)
        record["seed_id"] = f"os-train-{k}"
        seeds.append(record)
    tasks = task_records(seeds)
    for t in tasks:
        t["task_id"] = t["task_id"].replace("os-heldout", "os-train")
    return tasks


def collect_episodes(args) -> list[dict]:
    """Sampled solver episodes of the training tasks by the ``--episodes-from`` checkpoint."""
    from nemo_azr.evaluation.selfplay import SelfPlayEval
    from nemo_azr.preflight import load_config

    cfg = load_config(
        [
            "experiment=azr_sandbox_smollm2",
            f"eval.checkpoint={args.episodes_from}",
            "eval.greedy=false",
            f"eval.answers_per_prompt={args.episodes_per_task}",
            "eval.selfplay_proposals_per_seed=0",
            f"seed={args.seed}",
        ]
    )
    tasks = training_tasks()

    class TrainingGoals(SelfPlayEval):
        def _tasks(self) -> list[dict]:
            return tasks

    records = TrainingGoals(cfg).solver_records()
    by_id = {t["task_id"]: t for t in tasks}
    keys = ("task_id", "kind", "instruction", "harm_action", "success", "world", "seed_id", "seed_actions")
    return [{**{k: by_id[r["task_id"]][k] for k in keys}, "turns": r["turns"]} for r in records]


def fit(args, rows: list[dict]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from nemo_azr.preflight import load_config
    from nemo_azr.rewards.judge import build_judge

    cfg = load_config(["experiment=azr_sandbox_smollm2_judge"])
    torch.set_num_threads(cfg.trainer.num_threads or os.cpu_count() or 1)
    judge_cfg = cfg.absolute_zero.judge
    judge = build_judge(judge_cfg, policy_backend=None, tokenizer=None)  # its prompt and tokenizer
    tok = judge.tokenizer
    rubric = judge_cfg.safety_rubric
    examples = []
    for row in rows:
        history, safety, _ = replay(row)
        safe = safety > cfg.absolute_zero.learnability_safety_threshold
        prompt = judge.build_prompt(history, rubric)
        reply = tok(f"Score: {int(safe)}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        examples.append({"ids": prompt + reply, "reply": len(reply), "safe": safe})
    rng = random.Random(args.seed)
    rng.shuffle(examples)
    n_val = len(examples) // 5
    val, train = examples[:n_val], examples[n_val:]
    safe_train = [e for e in train if e["safe"]]
    unsafe_train = [e for e in train if not e["safe"]]
    if not safe_train or not unsafe_train:
        raise SystemExit(f"one class is empty ({len(safe_train)} safe, {len(unsafe_train)} unsafe)")

    source = Path(judge_cfg.model_path)
    if not (source / "config.json").is_file():
        from nemo_azr.models.importer import ensure_preset

        source = Path(ensure_preset(judge_cfg.model_path))
    model = AutoModelForCausalLM.from_pretrained(str(source), local_files_only=True, dtype=torch.float32)
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    losses, curve, best = [], [], None
    out = Path(args.out)
    candidate = out.with_name(out.name + ".candidate")
    start = time.perf_counter()
    for step in range(args.steps):
        # Balanced: half of each batch safe, half unsafe (the rule calls most episodes safe).
        batch = [rng.choice(safe_train) for _ in range(args.batch_size // 2)]
        batch += [rng.choice(unsafe_train) for _ in range(args.batch_size - len(batch))]
        width = max(len(e["ids"]) for e in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for i, e in enumerate(batch):
            n = len(e["ids"])
            ids[i, :n] = torch.tensor(e["ids"])
            attn[i, :n] = 1
            labels[i, n - e["reply"] : n] = ids[i, n - e["reply"] : n]
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 10 == 0 or step + 1 == args.steps:
            window = losses[-10:]
            print(
                f"judge fit: step {step + 1}/{args.steps}, loss {sum(window) / len(window):.3f}, "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
        if step + 1 == args.steps or (args.eval_every and (step + 1) % args.eval_every == 0):
            # Validation: the judge on training-goal episodes it was not fitted on, greedy as in use,
            # labelled by the rule (never the hand labels of the held-out goals, which judge it later).
            model.eval()
            agree, balanced, failures = _validate(model, tok, judge_cfg, val, candidate)
            model.train()
            curve.append({"step": step + 1, "agreement": round(agree, 4), "balanced": round(balanced, 4)})
            print(
                f"judge fit: step {step + 1}, validation agreement with the rule {agree:.3f} "
                f"(balanced {balanced:.3f})",
                flush=True,
            )
            if best is None or balanced > best["balanced"]:
                best = {"step": step + 1, "agreement": agree, "balanced": balanced, "failures": failures}
                if out.exists():
                    shutil.rmtree(out)
                candidate.rename(out)
            else:
                shutil.rmtree(candidate)
    return {
        "episodes": len(examples),
        "train": len(train),
        "train_safe": len(safe_train),
        "train_unsafe": len(unsafe_train),
        "validation": len(val),
        "validation_unsafe": sum(not e["safe"] for e in val),
        "validation_agreement_with_rule": round(best["agreement"], 4),
        "validation_balanced_agreement": round(best["balanced"], 4),
        "validation_parse_failures": best["failures"],
        "kept_step": best["step"],
        "validation_curve": curve,
        "loss_first_10": round(sum(losses[:10]) / min(10, len(losses)), 4),
        "loss_last_10": round(sum(losses[-10:]) / min(10, len(losses)), 4),
        "fit_s": round(time.perf_counter() - start, 1),
    }


def _validate(model, tok, judge_cfg, val: list[dict], folder: Path) -> tuple[float, float, int]:
    """(agreement with the rule, balanced agreement, unparsed replies) of the model saved to
    ``folder``, read through the judge exactly as self-play builds it."""
    from nemo_azr.rewards.judge import build_judge, parse_judge_score

    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    judge_cfg.model_path = str(folder)
    fitted = build_judge(judge_cfg, policy_backend=None, tokenizer=None)
    outputs = fitted.backend.generate(
        [_request(e["ids"][: -e["reply"]], i) for i, e in enumerate(val)], _greedy(judge_cfg.max_new_tokens)
    )
    verdicts = [parse_judge_score(o.samples[0].text if o.samples else "") for o in outputs]
    right = [v is not None and (v > 0.5) == e["safe"] for e, v in zip(val, verdicts)]
    agree = sum(right) / max(1, len(val))
    # Balanced: the rule calls most episodes safe, so a judge that always answers "safe" agrees often
    # and catches nothing; the mean of the two classes' recalls scores it 0.5.
    recalls = [
        sum(r for r, e in zip(right, val) if e["safe"] == cls) / max(1, sum(e["safe"] == cls for e in val))
        for cls in (True, False)
    ]
    return agree, sum(recalls) / 2, sum(v is None for v in verdicts)


def _request(prompt_ids: list[int], i: int):
    from nemo_azr.contracts.generation import GenerationRequest

    return GenerationRequest(prompt_ids=prompt_ids, request_id=i)


def _greedy(max_new_tokens: int):
    from nemo_azr.contracts.generation import SamplingParams

    return SamplingParams(n=1, greedy=True, max_new_tokens=max_new_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes-from", required=True, help="checkpoint that writes the episodes")
    parser.add_argument("--episodes-per-task", type=int, default=2)
    parser.add_argument("--episodes-file", type=Path, default=ROOT / "outputs" / "judge_episodes.jsonl")
    parser.add_argument("--out", default=str(ROOT / "outputs" / "judge_sandbox_smollm2"))
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="validate every N steps and keep the step with the best balanced agreement with the rule (0: the last)",
    )
    parser.add_argument(
        "--results-name", default="train_judge", help="results file stem under benchmarks/results"
    )
    args = parser.parse_args()
    if args.episodes_file.is_file():
        rows = [json.loads(line) for line in args.episodes_file.read_text().splitlines() if line.strip()]
        print(f"{len(rows)} episodes from {args.episodes_file}")
    else:
        rows = collect_episodes(args)
        args.episodes_file.parent.mkdir(parents=True, exist_ok=True)
        args.episodes_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_model()}, {os.cpu_count()} cores",
        "episodes_from": args.episodes_from,
        "episodes_per_task": args.episodes_per_task,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "out": os.path.relpath(args.out, ROOT),
        **fit(args, rows),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.results_name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
