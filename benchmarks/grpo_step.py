#!/usr/bin/env python
"""One GRPO training step: nemo_azr vs TRL's GRPOTrainer, side by side, on the tiny model (CPU, fp32).

Both frameworks get the same model folder, tokenizer and chat template, the same batch (8 prompts x 8
samples = 64 completions per optimizer step, generated in that step), the same sampling (temperature
1.0, top_p 1.0, top_k off, at most 8 new tokens), the same loss (PPO-clip eps 0.2, no KL, token-mean
over the batch; TRL ``loss_type="dapo"``), group-std reward scaling, one AdamW step per batch (lr 3e-4,
grad clip 1.0) and the same reward (nemo_azr's arithmetic task reward, math-verify).

Every (framework, vocab) case runs in its own subprocess with one torch thread; the cases are
interleaved (ours, TRL, ours, TRL, ...) for ``--reps`` repetitions. Each subprocess does W warm-up
steps, then S measured steps; peak memory is the kernel's RSS high-water mark (VmHWM), reset with
``/proc/self/clear_refs`` right before the measured steps.

Run it with the benchmark venv (see benchmarks/README.md):

    .venv-bench/bin/python benchmarks/grpo_step.py

Writes benchmarks/results/grpo_step.json and benchmarks/results/grpo_step.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_model, mem_total_gib, peak_rss, reset_peak_rss

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
BIG_VOCAB = 151936
KIB_PER_MIB = 1024.0

# The shared experimental setting (both frameworks).
PROMPTS_PER_STEP = 8
N_SAMPLES = 8
MAX_NEW_TOKENS = 8
TEMPERATURE = 1.0
TOP_P = 1.0
LR = 3e-4
GRAD_CLIP = 1.0
CLIP_EPS = 0.2
SEED = 0

TARGETS = {
    "time": 0.9,  # ours step time <= 0.9 x TRL (every vocab)
    "mem_small": 1.0,  # ours extra peak <= TRL at the tokenizer's vocab
    "mem_big": 0.5,  # ours extra peak <= 0.5 x TRL at vocab 151936
}

WORKER_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
    "WANDB_DISABLED": "true",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DISABLE_MLFLOW_INTEGRATION": "TRUE",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "PYTHONWARNINGS": "ignore",
}


# --------------------------------------------------------------------------------------------------
# /proc helpers
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# workers (one case per process)
# --------------------------------------------------------------------------------------------------
def source_fingerprint() -> str:
    """sha256 (12 hex) of the nemo_azr code this benchmark runs: its Python sources and the conf/ files the
    config is composed from (other experiments' YAML is left out)."""
    import hashlib

    root = HERE.parent
    conf = root / "conf"
    files = [
        *(root / "nemo_azr").rglob("*.py"),
        conf / "config.yaml",
        conf / "experiment" / "arithmetic_grpo.yaml",
    ]
    for group in ("model", "generation", "algorithm", "logger"):
        files += (conf / group).glob("*.yaml")
    h = hashlib.sha256()
    for f in sorted(files):
        if f.is_file():
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _worker_setup() -> None:
    import torch

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)


def _tiny_cfg(vocab: int, cache_dir: str):
    from nemo_azr.config.schema import TinyModelConfig

    return TinyModelConfig(vocab_size=vocab, cache_dir=cache_dir)


def run_ours(args) -> dict:
    import torch

    from nemo_azr.config.loader import load_config
    from nemo_azr.registry import GENERATION_BACKENDS
    from nemo_azr.trainer.trainer import Trainer

    out_dir = tempfile.mkdtemp(prefix="grpo_step_ours_")
    overrides = [
        "logger=quiet",
        "sft_warmup.steps=0",
        f"trainer.output_dir={out_dir}",
        f"trainer.max_steps={args.warmup + args.steps}",
        "trainer.num_threads=1",
        "trainer.device=cpu",
        f"seed={SEED}",
        f"model.tiny.cache_dir={args.cache_dir}",
        f"model.tiny.vocab_size={args.vocab}",
        "model.dtype=float32",
        f"data.prompts_per_step={PROMPTS_PER_STEP}",
        f"generation.n_samples={N_SAMPLES}",
        f"generation.temperature={TEMPERATURE}",
        f"generation.top_p={TOP_P}",
        "generation.top_k=0",
        f"generation.max_new_tokens={MAX_NEW_TOKENS}",
        "algorithm=grpo",
        "algorithm.kl.coef=0.0",
        f"algorithm.clip_ratio_low={CLIP_EPS}",
        f"algorithm.clip_ratio_high={CLIP_EPS}",
        "algorithm.loss_agg_mode=token-mean",
        "algorithm.ppo_epochs=1",
        "algorithm.mini_batch_size=0",
        f"optim.lr={LR}",
        f"optim.grad_clip={GRAD_CLIP}",
        "optim.weight_decay=0.0",
        "optim.schedule=constant",
    ]
    cfg = load_config(overrides)
    trainer = Trainer(cfg)
    torch.set_num_threads(1)
    # What Trainer.fit() does before its loop (fit() itself would also checkpoint and log).
    trainer.backend = GENERATION_BACKENDS.get(cfg.generation.backend)(
        trainer.policy.model, trainer.tokenizer, max_batch_size=cfg.generation.max_batch_size
    )
    trainer.backend.version = trainer.state.policy_version

    warm_times, times, phases, extra = [], [], [], {"reward_mean": [], "length_mean": [], "rows": []}
    for step in range(args.warmup):
        t0 = time.perf_counter()
        trainer.train_step(step)
        warm_times.append(time.perf_counter() - t0)
    rss_before = reset_peak_rss()
    for step in range(args.warmup, args.warmup + args.steps):
        t0 = time.perf_counter()
        m = trainer.train_step(step)
        times.append(time.perf_counter() - t0)
        named = {k.split("/", 1)[1]: m[k] for k in m if k.startswith("timing/") and k != "timing/step_s"}
        named["sync_other_s"] = times[-1] - sum(named.values())
        phases.append(named)
        extra["reward_mean"].append(m.get("reward/mean", float("nan")))
        extra["length_mean"].append(m.get("response/length_mean", float("nan")))
        extra["rows"].append(m.get("batch/rows", float("nan")))
    hwm = peak_rss()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {
        "framework": "nemo_azr",
        "vocab_size": int(trainer.policy.model.config.vocab_size),
        "tokenizer_size": len(trainer.tokenizer),
        "logprob_chunk_size": trainer.policy.chunk_size,
        "micro_batch_size": cfg.algorithm.micro_batch_size,
        "warmup_step_s": warm_times,
        "step_s": times,
        "phases_s": phases,
        "rss_before_kib": rss_before,
        "peak_rss_kib": hwm,
        "extra_peak_kib": hwm - rss_before,
        "torch_threads": torch.get_num_threads(),
        "completions_per_step": extra["rows"],
        "reward_mean": extra["reward_mean"],
        "completion_length_mean": extra["length_mean"],
    }


def run_trl(args) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_azr.config.schema import DataConfig
    from nemo_azr.models.tiny import ensure_tiny_model, load_tokenizer
    from nemo_azr.rollout.single_turn import encode_prompt
    from nemo_azr.tasks import build_task

    path = ensure_tiny_model(_tiny_cfg(args.vocab, args.cache_dir))
    tokenizer = load_tokenizer(path)
    task = build_task(DataConfig(prompts_per_step=PROMPTS_PER_STEP))
    by_question = {ex.question: ex for ex in task.examples}
    rows = [{"prompt": task.messages(ex), "question": ex.question} for ex in task.examples]
    # Same prompt tokens as nemo_azr (TRL applies the tokenizer's chat template itself).
    ours_ids = encode_prompt(tokenizer, rows[0]["prompt"])
    trl_ids = tokenizer.apply_chat_template(
        conversation=[rows[0]["prompt"]], add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"][0]
    if list(ours_ids) != list(trl_ids):
        raise RuntimeError(f"prompt tokens differ: ours {ours_ids} vs TRL {list(trl_ids)}")
    dataset = Dataset.from_list(rows)

    def arithmetic_reward(prompts, completions, question, **kwargs):
        return [task.reward(by_question[q], c[-1]["content"]) for q, c in zip(question, completions)]

    total = args.warmup + args.steps
    out_dir = tempfile.mkdtemp(prefix="grpo_step_trl_")
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        seed=SEED,
        max_steps=total,
        # batch: 8 prompts x 8 samples, generated every step, one optimizer step per generation batch
        per_device_train_batch_size=PROMPTS_PER_STEP * N_SAMPLES,
        gradient_accumulation_steps=1,
        num_generations=N_SAMPLES,
        generation_batch_size=PROMPTS_PER_STEP * N_SAMPLES,
        num_iterations=1,
        shuffle_dataset=True,
        # sampling
        use_vllm=False,
        max_completion_length=MAX_NEW_TOKENS,
        temperature=TEMPERATURE,
        top_p=TOP_P,
        top_k=0,
        # loss: PPO-clip, no KL, token-mean over the whole batch, group-std advantages
        beta=0.0,
        epsilon=CLIP_EPS,
        loss_type="dapo",
        scale_rewards="group",
        mask_truncated_completions=False,
        # optimizer
        optim="adamw_torch",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=GRAD_CLIP,
        # no logging / saving / eval
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)

    state: dict = {"rss_before": None, "hwm": None, "t0": 0.0, "step_s": [], "warm_s": [], "phases": []}
    state.update(reward_mean=[], length_mean=[], trainer=None)
    cur: dict[str, float] = {}
    counts = {"generate": 0}

    def timed(name, fn, count=False):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                cur[name] = cur.get(name, 0.0) + time.perf_counter() - t
                if count:
                    counts["generate"] += 1

        return wrapper

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args_, st, control, **kw):
            if st.global_step == args.warmup:
                state["rss_before"] = reset_peak_rss()
            cur.clear()
            state["gen_before"] = counts["generate"]
            state["t0"] = time.perf_counter()

        def on_step_end(self, args_, st, control, **kw):
            dt = time.perf_counter() - state["t0"]
            if counts["generate"] - state["gen_before"] != 1:
                raise RuntimeError("TRL did not generate exactly once in this step")
            if st.global_step <= args.warmup:
                state["warm_s"].append(dt)
                return
            state["step_s"].append(dt)
            tm = state["trainer"]._metrics["train"]
            state["reward_mean"].append(float(tm["reward"][-1]) if tm.get("reward") else float("nan"))
            state["length_mean"].append(
                float(tm["completions/mean_length"][-1])
                if tm.get("completions/mean_length")
                else float("nan")
            )
            ph = {
                "generate_s": cur.get("generate", 0.0),
                "reward_s": cur.get("reward", 0.0),
                "score_other_s": cur.get("gen_and_score", 0.0)
                - cur.get("generate", 0.0)
                - cur.get("reward", 0.0),
                "loss_forward_s": cur.get("compute_loss", 0.0),
            }
            ph["backward_optim_other_s"] = dt - cur.get("gen_and_score", 0.0) - cur.get("compute_loss", 0.0)
            state["phases"].append(ph)
            if st.global_step == total:
                state["hwm"] = peak_rss()

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimer()],
    )
    state["trainer"] = trainer
    torch.set_num_threads(1)
    # Phase timers (instance attributes shadow the methods the trainer calls through self.).
    trainer._generate = timed("generate", trainer._generate, count=True)
    trainer._calculate_rewards = timed("reward", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("gen_and_score", trainer._generate_and_score_completions)
    trainer.compute_loss = timed("compute_loss", trainer.compute_loss)
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)
    if state["hwm"] is None or len(state["step_s"]) != args.steps:
        raise RuntimeError(f"TRL ran {len(state['step_s'])} measured steps, expected {args.steps}")
    return {
        "framework": "trl",
        "vocab_size": int(model.config.vocab_size),
        "tokenizer_size": len(tokenizer),
        "warmup_step_s": state["warm_s"],
        "step_s": state["step_s"],
        "phases_s": state["phases"],
        "rss_before_kib": state["rss_before"],
        "peak_rss_kib": state["hwm"],
        "extra_peak_kib": state["hwm"] - state["rss_before"],
        "torch_threads": torch.get_num_threads(),
        "generate_calls": counts["generate"],
        "reward_mean": state["reward_mean"],
        "completion_length_mean": state["length_mean"],
    }


def worker_main(args) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    fingerprint = source_fingerprint()
    _worker_setup()
    result = (run_ours if args.worker == "ours" else run_trl)(args)
    result["pid"] = os.getpid()
    result["nemo_azr_source_sha"] = fingerprint
    Path(args.result_file).write_text(json.dumps(result))


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "accelerate", "datasets", "math-verify", "nemo_azr"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _median(xs):
    return statistics.median(xs) if xs else float("nan")


def _run_case(fw: str, vocab: int, warmup: int, steps: int, cache_dir: str, tmp: Path, tag: str) -> dict:
    result_file = tmp / f"{tag}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        fw,
        "--vocab",
        str(vocab),
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--cache-dir",
        cache_dir,
        "--result-file",
        str(result_file),
    ]
    env = {**os.environ, **WORKER_ENV}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result_file.is_file():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"worker {fw} vocab={vocab} failed (exit {proc.returncode})")
    res = json.loads(result_file.read_text())
    res["process_wall_s"] = wall
    return res


def _fmt_mib(kib: float) -> str:
    return f"{kib / KIB_PER_MIB:.1f}"


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions (each runs every case once)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps per process (small vocab)")
    p.add_argument("--steps", type=int, default=10, help="measured steps per process (small vocab)")
    p.add_argument("--big-warmup", type=int, default=1, help="warm-up steps per process (vocab 151936)")
    p.add_argument("--big-steps", type=int, default=3, help="measured steps per process (vocab 151936)")
    p.add_argument(
        "--cases", default="small,big", help="comma list of small (tokenizer vocab) and big (151936)"
    )
    p.add_argument("--frameworks", default="ours,trl")
    p.add_argument(
        "--cache-dir",
        default=os.environ.get("NEMO_AZR_CACHE", str(Path("~/.cache/nemo_azr").expanduser())),
        help="where the tiny models are built (outside the repo)",
    )
    p.add_argument("--out-dir", default=str(RESULTS_DIR))
    # worker mode
    p.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--vocab", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--result-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        worker_main(args)
        return

    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("needs Linux /proc/self/clear_refs to reset the peak-RSS high-water mark")
    command = shlex.join([sys.executable, *sys.argv])
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    case_cfg = {
        "small": {"vocab": 0, "warmup": args.warmup, "steps": args.steps},
        "big": {"vocab": BIG_VOCAB, "warmup": args.big_warmup, "steps": args.big_steps},
    }

    # Build the models once, before any timing (and so no worker races on the cache).
    from nemo_azr.models.tiny import ensure_tiny_model

    for c in cases:
        path = ensure_tiny_model(_tiny_cfg(case_cfg[c]["vocab"], args.cache_dir))
        case_cfg[c]["model_path"] = str(path)

    sha_before = source_fingerprint()
    load_before = os.getloadavg()
    started = _dt.datetime.now(_dt.timezone.utc)
    t_start = time.perf_counter()
    raw: dict[str, dict[str, list]] = {c: {f: [] for f in frameworks} for c in cases}
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        for r in range(args.reps):
            for c in cases:
                for fw in frameworks:
                    cc = case_cfg[c]
                    res = _run_case(
                        fw, cc["vocab"], cc["warmup"], cc["steps"], args.cache_dir, Path(tmp), f"{r}-{c}-{fw}"
                    )
                    raw[c][fw].append(res)
                    print(
                        f"[rep {r + 1}/{args.reps}] {c:5s} {fw:4s} vocab={res['vocab_size']:>6d} "
                        f"median step {_median(res['step_s']):.3f}s  extra peak {_fmt_mib(res['extra_peak_kib'])} MiB  "
                        f"peak RSS {_fmt_mib(res['peak_rss_kib'])} MiB  (process {res['process_wall_s']:.0f}s)",
                        flush=True,
                    )
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()
    sha_after = source_fingerprint()
    shas = sorted(
        {x["nemo_azr_source_sha"] for c in raw.values() for f in c.values() for x in f}
        | {sha_before, sha_after}
    )
    ours_shas = sorted({x["nemo_azr_source_sha"] for c in raw.values() for x in c.get("ours", [])})
    if len(ours_shas) > 1:
        print(
            f"WARNING: the nemo_azr workers ran different code ({ours_shas}); rerun for clean numbers",
            file=sys.stderr,
        )

    # ---- summarise ----
    summary: dict[str, dict] = {}
    for c in cases:
        s: dict = {
            "vocab_size": None,
            "warmup_steps": case_cfg[c]["warmup"],
            "measured_steps": case_cfg[c]["steps"],
        }
        for fw in frameworks:
            runs = raw[c][fw]
            s["vocab_size"] = runs[0]["vocab_size"]
            phase_keys = list(runs[0]["phases_s"][0]) if runs[0]["phases_s"] else []
            s[fw] = {
                "median_step_s_per_rep": [_median(x["step_s"]) for x in runs],
                "median_step_s": _median([t for x in runs for t in x["step_s"]]),
                "median_of_rep_medians_step_s": _median([_median(x["step_s"]) for x in runs]),
                "peak_rss_mib_per_rep": [x["peak_rss_kib"] / KIB_PER_MIB for x in runs],
                "rss_before_mib_per_rep": [x["rss_before_kib"] / KIB_PER_MIB for x in runs],
                "extra_peak_mib_per_rep": [x["extra_peak_kib"] / KIB_PER_MIB for x in runs],
                "median_peak_rss_mib": _median([x["peak_rss_kib"] / KIB_PER_MIB for x in runs]),
                "median_rss_before_mib": _median([x["rss_before_kib"] / KIB_PER_MIB for x in runs]),
                "median_extra_peak_mib": _median([x["extra_peak_kib"] / KIB_PER_MIB for x in runs]),
                "median_phases_s": {
                    k: _median([ph[k] for x in runs for ph in x["phases_s"]]) for k in phase_keys
                },
            }
        if "ours" in frameworks and "trl" in frameworks:
            o, t = s["ours"], s["trl"]
            s["ratio_time_ours_over_trl"] = o["median_step_s"] / t["median_step_s"]
            s["ratio_extra_peak_ours_over_trl"] = o["median_extra_peak_mib"] / t["median_extra_peak_mib"]
            s["ratio_peak_rss_ours_over_trl"] = o["median_peak_rss_mib"] / t["median_peak_rss_mib"]
            s["targets"] = {
                "time": {
                    "target": f"ours step time <= {TARGETS['time']} x TRL",
                    "pass": s["ratio_time_ours_over_trl"] <= TARGETS["time"],
                },
            }
            mem_t = TARGETS["mem_big"] if c == "big" else TARGETS["mem_small"]
            s["targets"]["extra_peak_memory"] = {
                "target": f"ours extra peak <= {mem_t} x TRL",
                "pass": s["ratio_extra_peak_ours_over_trl"] <= mem_t,
            }
        summary[c] = s

    report = {
        "benchmark": "grpo_step",
        "date_utc": started.isoformat(timespec="seconds"),
        "command": command,
        "elapsed_s": elapsed,
        "setting": {
            "prompts_per_step": PROMPTS_PER_STEP,
            "samples_per_prompt": N_SAMPLES,
            "completions_per_step": PROMPTS_PER_STEP * N_SAMPLES,
            "max_new_tokens": MAX_NEW_TOKENS,
            "temperature": TEMPERATURE,
            "top_p": TOP_P,
            "top_k": 0,
            "loss": "PPO-clip eps 0.2, no KL (beta=0), token-mean over the batch (TRL loss_type=dapo)",
            "advantages": "GRPO: (r - group mean) / group std",
            "optimizer": f"AdamW lr {LR}, betas (0.9, 0.999), eps 1e-8, wd 0, grad clip {GRAD_CLIP}, constant LR",
            "dtype": "float32",
            "device": "cpu",
            "reward": "nemo_azr arithmetic task reward (math-verify)",
            "reps": args.reps,
            "cases": {c: {k: v for k, v in case_cfg[c].items()} for c in cases},
            "torch_threads_per_process": 1,
            "worker_env": WORKER_ENV,
            "memory": "VmHWM after clear_refs=5 right before the measured steps; extra peak = VmHWM - VmRSS then",
        },
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)),
            "mem_total_gib": mem_total_gib(),
            "kernel": platform.release(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
        },
        "versions": _versions(),
        "nemo_azr_source_sha": {
            "before": sha_before,
            "after": sha_after,
            "all_seen": shas,
            "nemo_azr_workers": ours_shas,
        },
        "targets": TARGETS,
        "summary": summary,
        "raw": raw,
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpo_step.json").write_text(json.dumps(report, indent=1) + "\n")
    md = render_markdown(report, frameworks)
    (out / "grpo_step.md").write_text(md)
    print()
    print(md)


def render_markdown(report: dict, frameworks: list[str]) -> str:
    s, m, v = report["summary"], report["machine"], report["versions"]
    lines = [
        "# GRPO step: nemo_azr vs TRL GRPOTrainer (tiny model, CPU)",
        "",
        f"Date (UTC): {report['date_utc']}  ",
        f"Command: `{report['command']}`  ",
        f"Total benchmark time: {report['elapsed_s']:.0f} s",
        "",
        "## Setting",
        "",
        f"- Batch: {PROMPTS_PER_STEP} prompts x {N_SAMPLES} samples = {PROMPTS_PER_STEP * N_SAMPLES} "
        "completions, generated inside every step; one optimizer step per batch.",
        f"- Sampling: temperature {TEMPERATURE}, top_p {TOP_P}, top_k off, at most {MAX_NEW_TOKENS} new tokens; "
        "same tokenizer and ChatML template (prompt tokens checked equal).",
        f"- Loss: {report['setting']['loss']}; advantages {report['setting']['advantages']}.",
        f"- Optimizer: {report['setting']['optimizer']}; fp32 on CPU.",
        f'- Reward: {report["setting"]["reward"]} on "What is a + b?" prompts.',
        "- Each (framework, vocab) case runs in its own process with 1 torch thread (OMP_NUM_THREADS=1); cases are "
        f"interleaved ours, TRL, ours, TRL, ... for {report['setting']['reps']} repetitions.",
        "- Step time: median over all measured steps of all repetitions (wall time of `Trainer.train_step` for "
        "nemo_azr; `on_step_begin` -> `on_step_end` for TRL, which covers generation, reward, loss, backward, "
        "clip and the optimizer step).",
        "- Memory: `VmHWM` (peak RSS) over the measured steps, reset with `/proc/self/clear_refs` just before them; "
        "extra peak = VmHWM - RSS before the measured steps. Medians over repetitions.",
        "",
        "| case | warm-up / measured steps per process |",
        "| --- | --- |",
    ]
    for cs in s.values():
        lines.append(f"| vocab {cs['vocab_size']} | {cs['warmup_steps']} / {cs['measured_steps']} |")
    lines += [
        "",
        "## Results",
        "",
        "| vocab | framework | median step (s) | per-rep median step (s) | RSS before (MiB) | peak RSS (MiB) "
        "| extra peak (MiB) | per-rep extra peak (MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {"ours": "nemo_azr", "trl": f"TRL {v.get('trl')}"}
    for cs in s.values():
        for fw in frameworks:
            d = cs[fw]
            lines.append(
                f"| {cs['vocab_size']} | {names[fw]} | {d['median_step_s']:.3f} | "
                f"{', '.join(f'{x:.3f}' for x in d['median_step_s_per_rep'])} | {d['median_rss_before_mib']:.1f} | "
                f"{d['median_peak_rss_mib']:.1f} | {d['median_extra_peak_mib']:.1f} | "
                f"{', '.join(f'{x:.1f}' for x in d['extra_peak_mib_per_rep'])} |"
            )
    if all("targets" in cs for cs in s.values()):
        lines += [
            "",
            "## Targets",
            "",
            "| vocab | metric | ours / TRL | target | result |",
            "| --- | --- | --- | --- | --- |",
        ]
        for c, cs in s.items():
            t = cs["targets"]
            lines.append(
                f"| {cs['vocab_size']} | step time | {cs['ratio_time_ours_over_trl']:.2f} | "
                f"<= {TARGETS['time']} | {'PASS' if t['time']['pass'] else 'FAIL'} |"
            )
            mem_t = TARGETS["mem_big"] if c == "big" else TARGETS["mem_small"]
            lines.append(
                f"| {cs['vocab_size']} | extra peak memory | {cs['ratio_extra_peak_ours_over_trl']:.2f} | "
                f"<= {mem_t} | {'PASS' if t['extra_peak_memory']['pass'] else 'FAIL'} |"
            )
    lines += ["", "## Where the time goes (median seconds per step, over all measured steps)", ""]
    for cs in s.values():
        for fw in frameworks:
            ph = cs[fw]["median_phases_s"]
            parts = ", ".join(f"{k} {val:.3f}" for k, val in ph.items())
            lines.append(f"- vocab {cs['vocab_size']}, {names[fw]}: {parts}")
    lines += [
        "",
        "nemo_azr phases are the `timing/*` metrics of `train_step` (rollout = generation + packing, reward, "
        "logprob = old log-probs forward, update = forward/backward/optimizer; sync_other = weight sync to the "
        "generation copy + metrics). TRL phases come from timers wrapped around `_generate`, `_calculate_rewards`, "
        "`_generate_and_score_completions` (score_other = the rest of it: padding, advantages, ...) and "
        "`compute_loss` (the training forward); backward_optim_other = backward, grad clip, AdamW step and "
        "the Trainer loop around them.",
        "",
        "## Notes",
        "",
        "- The machine is shared: the load average below includes other processes, so absolute times drift "
        "between repetitions; the cases are interleaved so both frameworks see the same conditions, and the "
        "per-repetition numbers show the spread.",
        "- At vocab 1000 the extra peak is a few tens of MiB, the size of glibc allocator noise (memory freed "
        "during warm-up and reused), so that comparison is coarse; at vocab 151936 it is dominated by "
        "[tokens x vocab] logits and is stable across repetitions.",
        "- TRL's step runs `model.generate` (no vLLM), then its fused chunked LM head (`add_fused_lm_head`) "
        "for the loss, which on CPU (no Triton) scores every prompt+completion position and computes entropy "
        "too; with num_iterations=1 it reuses the detached current log-probs as the old ones, as nemo_azr does "
        "when it takes them from the update pass.",
        "",
        "## Machine",
        "",
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['cpus_available']} available)",
        f"- RAM: {m['mem_total_gib']:.1f} GiB; kernel {m['kernel']}",
        f"- Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in m['loadavg_before'])}; "
        f"after: {', '.join(f'{x:.2f}' for x in m['loadavg_after'])}",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- nemo_azr code measured (sha256 of nemo_azr/**/*.py + the conf/ files used, 12 hex): "
        + ", ".join(report["nemo_azr_source_sha"]["nemo_azr_workers"])
        + (
            " -- THE nemo_azr WORKERS RAN DIFFERENT CODE, numbers mix versions"
            if len(report["nemo_azr_source_sha"]["nemo_azr_workers"]) > 1
            else ""
        )
        + f" (before the run {report['nemo_azr_source_sha']['before']}, after {report['nemo_azr_source_sha']['after']})",
        "",
        "Raw per-repetition numbers (every step time, RSS values, phase timings) are in `grpo_step.json`.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
