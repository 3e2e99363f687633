#!/usr/bin/env python
"""One GRPO training step: nemo_azr vs TRL's GRPOTrainer, side by side (CPU, fp32).

Two modes (``--mode``), each a fixed setting that both frameworks get in full (see ``SETTINGS``):

- ``tiny`` (default): the locally built tiny model at its tokenizer's vocabulary (1000) and padded to
  151936; 8 prompts x 8 samples = 64 completions per step, at most 8 new tokens, AdamW lr 3e-4, single-digit
  additions, one torch thread per process.
- ``smollm2``: the real SmolLM2-135M-Instruct from a local HF folder (``--model-path DIR``; nothing is
  downloaded); 4 prompts x 4 samples = 16 completions per step, at most 32 new tokens, AdamW lr 1e-6,
  the arithmetic_grpo_smollm2 experiment's prompts (two-digit additions/subtractions with non-negative
  results, ``SMOLLM2_QUESTION``), two torch threads per process.

In both modes the frameworks get the same model folder, tokenizer and chat template (prompt tokens checked
equal), the same batch shape (completions generated inside every step, one optimizer step per batch), the
same sampling (temperature 1.0, top_p 1.0, top_k off), the same loss (PPO-clip eps 0.2, no KL, token-mean
over the batch; TRL ``loss_type="dapo"``), group-std reward scaling, the same AdamW step (grad clip 1.0) and
the same reward (nemo_azr's arithmetic task reward, math-verify).

Every (framework, case) runs in its own subprocess; the cases are interleaved (ours, TRL, ours, TRL, ...)
for ``--reps`` repetitions. Each subprocess does W warm-up steps, then S measured steps; peak memory is the
kernel's RSS high-water mark (VmHWM), reset with ``/proc/self/clear_refs`` right before the measured steps.

Run it with the benchmark venv (see benchmarks/README.md):

    .venv-bench/bin/python benchmarks/grpo_step.py
    .venv-bench/bin/python benchmarks/grpo_step.py --mode smollm2 --model-path DIR

Writes benchmarks/results/grpo_step.{json,md} (tiny) or benchmarks/results/grpo_step_smollm2.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
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
from dataclasses import asdict, dataclass
from pathlib import Path

from machine import cpu_model, mem_total_gib, peak_rss, reset_peak_rss

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
BIG_VOCAB = 151936
KIB_PER_MIB = 1024.0

# Shared by every mode and both frameworks.
TEMPERATURE = 1.0
TOP_P = 1.0
GRAD_CLIP = 1.0
CLIP_EPS = 0.2
SEED = 0

# The real-model prompts are the arithmetic_grpo_smollm2 experiment's: two-digit additions and subtractions
# with non-negative results, the answer format stated in the question, the chat template's default system
# prompt.
SMOLLM2_QUESTION = "What is {a} {op} {b}? Reply with just the number."
SMOLLM2_MIN_OPERAND = 10
SMOLLM2_MAX_OPERAND = 99
SMOLLM2_OPERATIONS = ("+", "-")


@dataclass(frozen=True)
class Setting:
    """One mode's experimental setting; both frameworks get all of it."""

    mode: str
    model_name: str
    prompts_per_step: int
    n_samples: int
    max_new_tokens: int
    lr: float
    threads: int  # torch intra-op (and OMP/MKL/OpenBLAS) threads of every worker process
    results_stem: str  # results/<stem>.json and .md
    system_prompt: str = ""
    question_template: str = "What is {a} {op} {b}?"
    nonnegative: bool = False
    min_operand: int = 0  # data.arithmetic: the default experiment's single-digit additions
    max_operand: int = 9
    operations: tuple[str, ...] = ("+",)
    reps: int = 3  # defaults of --reps / --warmup / --steps
    warmup: int = 2
    steps: int = 10


SETTINGS = {
    "tiny": Setting(
        mode="tiny",
        model_name="tiny model (built locally)",
        prompts_per_step=8,
        n_samples=8,
        max_new_tokens=8,
        lr=3e-4,
        threads=1,
        results_stem="grpo_step",
    ),
    # The measured setting: "GRPO ~11 s/step for 4x4 samples x 32 tokens". lr 1e-6: a sensible
    # real-model lr (the step time does not depend on it).
    "smollm2": Setting(
        mode="smollm2",
        model_name="SmolLM2-135M-Instruct",
        prompts_per_step=4,
        n_samples=4,
        max_new_tokens=32,
        lr=1e-6,
        threads=2,
        results_stem="grpo_step_smollm2",
        question_template=SMOLLM2_QUESTION,
        nonnegative=True,
        min_operand=SMOLLM2_MIN_OPERAND,
        max_operand=SMOLLM2_MAX_OPERAND,
        operations=SMOLLM2_OPERATIONS,
        reps=3,
        warmup=1,
        steps=3,
    ),
}

TARGETS = {  # tiny mode only
    "time": 0.9,  # ours step time <= 0.9 x TRL (every vocab)
    "mem_small": 1.0,  # ours extra peak <= TRL at the tokenizer's vocab
    "mem_big": 0.5,  # ours extra peak <= 0.5 x TRL at vocab 151936
}

WORKER_ENV = {
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


def worker_env(threads: int) -> dict[str, str]:
    """Environment of a worker process: offline, quiet, ``threads`` OMP/MKL/OpenBLAS threads."""
    n = str(threads)
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "OPENBLAS_NUM_THREADS": n, **WORKER_ENV}


# --------------------------------------------------------------------------------------------------
# /proc helpers
# --------------------------------------------------------------------------------------------------
# --------------------------------------------------------------------------------------------------
# workers (one case per process)
# --------------------------------------------------------------------------------------------------
def source_fingerprint() -> str:
    """sha256 (12 hex) of the nemo_azr code this benchmark runs: its Python sources and the conf/ files the
    config is composed from (other experiments' YAML is left out)."""
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


def _worker_setup(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)


def _tiny_cfg(vocab: int, cache_dir: str):
    from nemo_azr.config.schema import TinyModelConfig

    return TinyModelConfig(vocab_size=vocab, cache_dir=cache_dir)


def _data_cfg(st: Setting):
    """The task's DataConfig (TRL side); the nemo_azr side gets the same through ``_data_overrides``."""
    from nemo_azr.config.schema import ArithmeticTaskConfig, DataConfig

    return DataConfig(
        prompts_per_step=st.prompts_per_step,
        system_prompt=st.system_prompt,
        arithmetic=ArithmeticTaskConfig(
            min_operand=st.min_operand,
            max_operand=st.max_operand,
            operations=list(st.operations),
            nonnegative=st.nonnegative,
            question_template=st.question_template,
        ),
    )


def _hydra_str(text: str) -> str:
    """A Hydra override value: ``text`` as a single-quoted string."""
    return "'" + text.replace("'", "\\'") + "'"


def _data_overrides(st: Setting) -> list[str]:
    ops = ",".join(_hydra_str(op) for op in st.operations)
    return [
        f"data.prompts_per_step={st.prompts_per_step}",
        f"data.system_prompt={_hydra_str(st.system_prompt)}",
        f"data.arithmetic.min_operand={st.min_operand}",
        f"data.arithmetic.max_operand={st.max_operand}",
        f"data.arithmetic.operations=[{ops}]",
        f"data.arithmetic.nonnegative={st.nonnegative}",
        f"data.arithmetic.question_template={_hydra_str(st.question_template)}",
    ]


def _first_prompt_ids(tokenizer, task) -> list[int]:
    """Token ids of the task's first prompt, as nemo_azr encodes it (the driver compares the frameworks)."""
    from nemo_azr.rollout.single_turn import encode_prompt

    return [int(t) for t in encode_prompt(tokenizer, task.messages(task.examples[0]))]


def run_ours(args, st: Setting) -> dict:
    import torch

    from nemo_azr.preflight import load_config
    from nemo_azr.registry import GENERATION_BACKENDS
    from nemo_azr.trainer.trainer import Trainer

    out_dir = tempfile.mkdtemp(prefix="grpo_step_ours_")
    if args.model_path:
        model_overrides = [f"model.path={args.model_path}"]
    else:
        model_overrides = [f"model.tiny.cache_dir={args.cache_dir}", f"model.tiny.vocab_size={args.vocab}"]
    overrides = [
        "logger=quiet",
        "sft_warmup.steps=0",
        f"trainer.output_dir={out_dir}",
        f"trainer.max_steps={args.warmup + args.steps}",
        f"trainer.num_threads={st.threads}",
        "trainer.device=cpu",
        f"seed={SEED}",
        *model_overrides,
        "model.dtype=float32",
        *_data_overrides(st),
        f"generation.n_samples={st.n_samples}",
        f"generation.temperature={TEMPERATURE}",
        f"generation.top_p={TOP_P}",
        "generation.top_k=0",
        f"generation.max_new_tokens={st.max_new_tokens}",
        "algorithm=grpo",
        "algorithm.kl.coef=0.0",
        f"algorithm.clip_ratio_low={CLIP_EPS}",
        f"algorithm.clip_ratio_high={CLIP_EPS}",
        "algorithm.loss_agg_mode=token-mean",
        "algorithm.ppo_epochs=1",
        "algorithm.mini_batch_size=0",
        f"optim.lr={st.lr}",
        f"optim.grad_clip={GRAD_CLIP}",
        "optim.weight_decay=0.0",
        "optim.schedule=constant",
    ]
    cfg = load_config(overrides)
    trainer = Trainer(cfg)
    torch.set_num_threads(st.threads)
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
        "model_path": str(trainer.model_path),
        "n_params": sum(p.numel() for p in trainer.policy.model.parameters()),
        "vocab_size": int(trainer.policy.model.config.vocab_size),
        "tokenizer_size": len(trainer.tokenizer),
        "n_prompts": len(trainer.task.examples),
        "first_prompt_ids": _first_prompt_ids(trainer.tokenizer, trainer.task),
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


def run_trl(args, st: Setting) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from nemo_azr.models.tiny import ensure_tiny_model, load_tokenizer
    from nemo_azr.rollout.single_turn import encode_prompt
    from nemo_azr.tasks import build_task

    if args.model_path:
        path = Path(args.model_path).resolve()
    else:
        path = ensure_tiny_model(_tiny_cfg(args.vocab, args.cache_dir))
    tokenizer = load_tokenizer(path)
    task = build_task(_data_cfg(st))
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
        # batch: P prompts x N samples, generated every step, one optimizer step per generation batch
        per_device_train_batch_size=st.prompts_per_step * st.n_samples,
        gradient_accumulation_steps=1,
        num_generations=st.n_samples,
        generation_batch_size=st.prompts_per_step * st.n_samples,
        num_iterations=1,
        shuffle_dataset=True,
        # sampling
        use_vllm=False,
        max_completion_length=st.max_new_tokens,
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
        learning_rate=st.lr,
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
    torch.set_num_threads(st.threads)
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
        "model_path": str(path),
        "n_params": sum(p.numel() for p in model.parameters()),
        "vocab_size": int(model.config.vocab_size),
        "tokenizer_size": len(tokenizer),
        "n_prompts": len(rows),
        "first_prompt_ids": _first_prompt_ids(tokenizer, task),
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
    st = SETTINGS[args.mode]
    _worker_setup(st.threads)
    result = (run_ours if args.worker == "ours" else run_trl)(args, st)
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


def _run_case(fw: str, st: Setting, case: dict, cache_dir: str, tmp: Path, tag: str) -> dict:
    result_file = tmp / f"{tag}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        fw,
        "--mode",
        st.mode,
        "--vocab",
        str(case["vocab"]),
        "--warmup",
        str(case["warmup"]),
        "--steps",
        str(case["steps"]),
        "--cache-dir",
        cache_dir,
        "--result-file",
        str(result_file),
    ]
    if st.mode != "tiny":
        cmd += ["--model-path", case["model_path"]]
    env = {**os.environ, **worker_env(st.threads)}
    load = os.getloadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not result_file.is_file():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"worker {fw} vocab={case['vocab']} failed (exit {proc.returncode})")
    res = json.loads(result_file.read_text())
    res["process_wall_s"] = wall
    res["loadavg_at_start"] = load
    res["loadavg_at_end"] = os.getloadavg()
    return res


def _fmt_mib(kib: float) -> str:
    return f"{kib / KIB_PER_MIB:.1f}"


def model_info(path: Path) -> dict:
    """What the real-model results were taken on: config fields and the weights' sha256 (12 hex)."""
    cfg = json.loads((path / "config.json").read_text())
    keys = (
        "architectures",
        "model_type",
        "vocab_size",
        "num_hidden_layers",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "tie_word_embeddings",
        "eos_token_id",
        "max_position_embeddings",
    )
    info: dict = {"path": str(path), **{k: cfg.get(k) for k in keys}}
    for weights in sorted(path.glob("*.safetensors")):
        h = hashlib.sha256()
        with open(weights, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                h.update(block)
        info.setdefault("weights", {})[weights.name] = {
            "bytes": weights.stat().st_size,
            "sha256_12": h.hexdigest()[:12],
        }
    return info


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--mode",
        choices=sorted(SETTINGS),
        default="tiny",
        help="tiny: the locally built tiny model (two vocab sizes); smollm2: SmolLM2-135M-Instruct from --model-path",
    )
    p.add_argument(
        "--model-path",
        default=None,
        help="--mode smollm2: local HF folder of SmolLM2-135M-Instruct (config.json, weights, tokenizer); "
        "never downloaded",
    )
    p.add_argument(
        "--reps", type=int, default=None, help="repetitions, each runs every case once (default 3)"
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up steps per process (tiny small vocab: 2; smollm2: 1)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="measured steps per process (tiny small vocab: 10; smollm2: 3)",
    )
    p.add_argument("--big-warmup", type=int, default=1, help="warm-up steps per process (tiny, vocab 151936)")
    p.add_argument("--big-steps", type=int, default=3, help="measured steps per process (tiny, vocab 151936)")
    p.add_argument(
        "--cases",
        default="small,big",
        help="tiny mode: comma list of small (tokenizer vocab) and big (151936)",
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
    st = SETTINGS[args.mode]
    if args.warmup is None:
        args.warmup = st.warmup
    if args.steps is None:
        args.steps = st.steps
    if args.reps is None:
        args.reps = st.reps

    if args.worker:
        worker_main(args)
        return

    if not Path("/proc/self/clear_refs").exists():
        raise SystemExit("needs Linux /proc/self/clear_refs to reset the peak-RSS high-water mark")
    command = shlex.join([sys.executable, *sys.argv])
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    info = None
    if st.mode == "tiny":
        if args.model_path:
            raise SystemExit("--model-path is for --mode smollm2 (tiny mode builds its own models)")
        cases = [c.strip() for c in args.cases.split(",") if c.strip()]
        case_cfg = {
            "small": {"vocab": 0, "warmup": args.warmup, "steps": args.steps},
            "big": {"vocab": BIG_VOCAB, "warmup": args.big_warmup, "steps": args.big_steps},
        }
        # Build the models once, before any timing (and so no worker races on the cache).
        from nemo_azr.models.tiny import ensure_tiny_model

        for c in cases:
            path = ensure_tiny_model(_tiny_cfg(case_cfg[c]["vocab"], args.cache_dir))
            case_cfg[c]["model_path"] = str(path)
    else:
        if not args.model_path:
            raise SystemExit(f"--mode {st.mode} needs --model-path DIR (a local HF model folder)")
        model_dir = Path(args.model_path).expanduser().resolve()
        if not (model_dir / "config.json").is_file():
            raise SystemExit(
                f"--model-path {args.model_path}: no config.json (a local HF model folder is needed)"
            )
        info = model_info(model_dir)
        cases = [st.mode]
        case_cfg = {
            st.mode: {"vocab": 0, "warmup": args.warmup, "steps": args.steps, "model_path": str(model_dir)}
        }

    sha_before = source_fingerprint()
    load_before = os.getloadavg()
    started = _dt.datetime.now(_dt.timezone.utc)
    t_start = time.perf_counter()
    raw: dict[str, dict[str, list]] = {c: {f: [] for f in frameworks} for c in cases}
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        for r in range(args.reps):
            for c in cases:
                for fw in frameworks:
                    res = _run_case(fw, st, case_cfg[c], args.cache_dir, Path(tmp), f"{r}-{c}-{fw}")
                    raw[c][fw].append(res)
                    print(
                        f"[rep {r + 1}/{args.reps}] {c:5s} {fw:4s} vocab={res['vocab_size']:>6d} "
                        f"median step {_median(res['step_s']):.3f}s  extra peak {_fmt_mib(res['extra_peak_kib'])} MiB  "
                        f"peak RSS {_fmt_mib(res['peak_rss_kib'])} MiB  (process {res['process_wall_s']:.0f}s, "
                        f"load {res['loadavg_at_start'][0]:.2f})",
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
    # Both frameworks must have seen the same prompts, token for token.
    for c in cases:
        seen = {(x["n_prompts"], tuple(x["first_prompt_ids"])) for f in raw[c].values() for x in f}
        if len(seen) > 1:
            raise SystemExit(f"case {c}: the frameworks' prompts differ: {sorted(seen)}")

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
                "median_reward_mean": _median([v for x in runs for v in x["reward_mean"]]),
                "median_completion_length_mean": _median(
                    [v for x in runs for v in x["completion_length_mean"]]
                ),
            }
        if "ours" in frameworks and "trl" in frameworks:
            o, t = s["ours"], s["trl"]
            s["ratio_time_ours_over_trl"] = o["median_step_s"] / t["median_step_s"]
            s["ratio_extra_peak_ours_over_trl"] = o["median_extra_peak_mib"] / t["median_extra_peak_mib"]
            s["ratio_peak_rss_ours_over_trl"] = o["median_peak_rss_mib"] / t["median_peak_rss_mib"]
            if st.mode == "tiny":
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

    case_runs = [x for c in raw.values() for f in c.values() for x in f]
    report = {
        "benchmark": "grpo_step",
        "mode": st.mode,
        "date_utc": started.isoformat(timespec="seconds"),
        "command": command,
        "elapsed_s": elapsed,
        "setting": {
            "model": st.model_name,
            "prompts_per_step": st.prompts_per_step,
            "samples_per_prompt": st.n_samples,
            "completions_per_step": st.prompts_per_step * st.n_samples,
            "max_new_tokens": st.max_new_tokens,
            "temperature": TEMPERATURE,
            "top_p": TOP_P,
            "top_k": 0,
            "loss": "PPO-clip eps 0.2, no KL (beta=0), token-mean over the batch (TRL loss_type=dapo)",
            "advantages": "GRPO: (r - group mean) / group std",
            "optimizer": f"AdamW lr {st.lr}, betas (0.9, 0.999), eps 1e-8, wd 0, grad clip {GRAD_CLIP}, constant LR",
            "dtype": "float32",
            "device": "cpu",
            "reward": "nemo_azr arithmetic task reward (math-verify)",
            "system_prompt": st.system_prompt,
            "question_template": st.question_template,
            "nonnegative": st.nonnegative,
            "arithmetic": {
                "min_operand": st.min_operand,
                "max_operand": st.max_operand,
                "operations": list(st.operations),
                "n_prompts": raw[cases[0]][frameworks[0]][0]["n_prompts"],
            },
            "first_prompt_ids": raw[cases[0]][frameworks[0]][0]["first_prompt_ids"],
            "reps": args.reps,
            "cases": {c: {k: v for k, v in case_cfg[c].items()} for c in cases},
            "torch_threads_per_process": st.threads,
            "worker_env": worker_env(st.threads),
            "memory": "VmHWM after clear_refs=5 right before the measured steps; extra peak = VmHWM - VmRSS then",
            "mode_setting": asdict(st),
        },
        "model": info,
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "cpus_available": len(os.sched_getaffinity(0)),
            "mem_total_gib": mem_total_gib(),
            "kernel": platform.release(),
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "loadavg_1min_at_case_starts": [x["loadavg_at_start"][0] for x in case_runs],
            "loadavg_1min_at_case_ends": [x["loadavg_at_end"][0] for x in case_runs],
        },
        "versions": _versions(),
        "nemo_azr_source_sha": {
            "before": sha_before,
            "after": sha_after,
            "all_seen": shas,
            "nemo_azr_workers": ours_shas,
        },
        "targets": TARGETS if st.mode == "tiny" else None,
        "summary": summary,
        "raw": raw,
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{st.results_stem}.json").write_text(json.dumps(report, indent=1) + "\n")
    md = render_markdown(report, frameworks)
    (out / f"{st.results_stem}.md").write_text(md)
    print()
    print(md)


def render_markdown(report: dict, frameworks: list[str]) -> str:
    if report.get("mode", "tiny") == "tiny":
        return _render_tiny(report, frameworks)
    return _render_real(report, frameworks)


def _framework_names(report: dict) -> dict[str, str]:
    return {"ours": "nemo_azr", "trl": f"TRL {report['versions'].get('trl')}"}


def _setting_lines(report: dict) -> list[str]:
    """Batch, sampling, loss, optimizer: the same in every mode."""
    st = report["setting"]
    return [
        f"- Batch: {st['prompts_per_step']} prompts x {st['samples_per_prompt']} samples = "
        f"{st['completions_per_step']} completions, generated inside every step; one optimizer step per batch.",
        f"- Sampling: temperature {st['temperature']}, top_p {st['top_p']}, top_k off, at most "
        f"{st['max_new_tokens']} new tokens; same tokenizer and ChatML template (prompt tokens checked equal).",
        f"- Loss: {st['loss']}; advantages {st['advantages']}.",
        f"- Optimizer: {st['optimizer']}; fp32 on CPU.",
    ]


def _phase_lines(report: dict, frameworks: list[str], label) -> list[str]:
    names = _framework_names(report)
    lines = []
    for cs in report["summary"].values():
        for fw in frameworks:
            ph = cs[fw]["median_phases_s"]
            parts = ", ".join(f"{k} {val:.3f}" for k, val in ph.items())
            lines.append(f"- {label(cs)}{names[fw]}: {parts}")
    return lines


PHASES_NOTE = (
    "nemo_azr phases are the `timing/*` metrics of `train_step` (rollout = generation + packing, reward, "
    "logprob = old log-probs forward, update = forward/backward/optimizer; sync_other = weight sync to the "
    "generation copy + metrics). TRL phases come from timers wrapped around `_generate`, `_calculate_rewards`, "
    "`_generate_and_score_completions` (score_other = the rest of it: padding, advantages, ...) and "
    "`compute_loss` (the training forward); backward_optim_other = backward, grad clip, AdamW step and "
    "the Trainer loop around them."
)


def _machine_lines(report: dict) -> list[str]:
    m, v = report["machine"], report["versions"]
    shas = report["nemo_azr_source_sha"]
    return [
        f"- CPU: {m['cpu_model']}, {m['logical_cpus']} logical CPUs ({m['cpus_available']} available)",
        f"- RAM: {m['mem_total_gib']:.1f} GiB; kernel {m['kernel']}",
        f"- Load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in m['loadavg_before'])}; "
        f"after: {', '.join(f'{x:.2f}' for x in m['loadavg_after'])}",
        "- Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
        "- nemo_azr code measured (sha256 of nemo_azr/**/*.py + the conf/ files used, 12 hex): "
        + ", ".join(shas["nemo_azr_workers"])
        + (
            " -- THE nemo_azr WORKERS RAN DIFFERENT CODE, numbers mix versions"
            if len(shas["nemo_azr_workers"]) > 1
            else ""
        )
        + f" (before the run {shas['before']}, after {shas['after']})",
    ]


def _render_tiny(report: dict, frameworks: list[str]) -> str:
    s = report["summary"]
    lines = [
        "# GRPO step: nemo_azr vs TRL GRPOTrainer (tiny model, CPU)",
        "",
        f"Date (UTC): {report['date_utc']}  ",
        f"Command: `{report['command']}`  ",
        f"Total benchmark time: {report['elapsed_s']:.0f} s",
        "",
        "## Setting",
        "",
        *_setting_lines(report),
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
    names = _framework_names(report)
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
    lines += _phase_lines(report, frameworks, lambda cs: f"vocab {cs['vocab_size']}, ")
    lines += [
        "",
        PHASES_NOTE,
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
        *_machine_lines(report),
        "",
        "Raw per-repetition numbers (every step time, RSS values, phase timings) are in `grpo_step.json`.",
        "",
    ]
    return "\n".join(lines)


def _render_real(report: dict, frameworks: list[str]) -> str:
    st, mi, m = report["setting"], report["model"] or {}, report["machine"]
    (case,) = report["summary"].values()
    names = _framework_names(report)
    ar = st["arithmetic"]
    ops = " and ".join(f"`{op}`" for op in ar["operations"])
    weights = ", ".join(f"{k} sha256 {w['sha256_12']}" for k, w in (mi.get("weights") or {}).items())
    (runs,) = report["raw"].values()
    n_params = runs[frameworks[0]][0]["n_params"]
    loads = (m.get("loadavg_1min_at_case_starts") or []) + (m.get("loadavg_1min_at_case_ends") or [])
    stem = report["setting"]["mode_setting"]["results_stem"]
    lines = [
        f"# GRPO step: nemo_azr vs TRL GRPOTrainer ({st['model']}, CPU)",
        "",
        f"Date (UTC): {report['date_utc']}  ",
        f"Command: `{report['command']}`  ",
        f"Total benchmark time: {report['elapsed_s']:.0f} s",
        "",
        "## Setting",
        "",
        f"- Model: {st['model']} ({', '.join(mi.get('architectures') or [])}, {n_params / 1e6:.1f}M parameters, "
        f"vocab {mi.get('vocab_size')}, {mi.get('num_hidden_layers')} layers, hidden {mi.get('hidden_size')}, "
        f"{mi.get('num_attention_heads')} heads / {mi.get('num_key_value_heads')} KV heads"
        f"{', tied embeddings' if mi.get('tie_word_embeddings') else ''}), loaded by both frameworks from the same local folder ({weights}); "
        "fp32 on CPU.",
        f"- Prompts: {ar['n_prompts']} two-digit problems, operands {ar['min_operand']}..{ar['max_operand']}, "
        f'{ops}, question "{st["question_template"]}"{" (non-negative results)" if st.get("nonnegative") else ""}, '
        f'system prompt "{st["system_prompt"] or "(the chat template default)"}"; the first prompt is '
        f"{len(st['first_prompt_ids'])} tokens with the model's ChatML template, identical for both frameworks. "
        f"Reward: {st['reward']}.",
        *_setting_lines(report),
        f"- Threads: every (framework, repetition) runs in its own process with {st['torch_threads_per_process']} "
        f"torch threads (OMP/MKL/OpenBLAS_NUM_THREADS={st['torch_threads_per_process']}, the machine's cores), "
        "the same for both frameworks; the processes run one at a time, interleaved ours, TRL, ours, TRL, ... for "
        f"{st['reps']} repetitions.",
        f"- Each process: {case['warmup_steps']} warm-up step(s), then {case['measured_steps']} measured steps. "
        "Step time: median over all measured steps of all repetitions (wall time of `Trainer.train_step` for "
        "nemo_azr; `on_step_begin` -> `on_step_end` for TRL: generation, reward, loss, backward, clip and the "
        "optimizer step).",
        "- Memory: `VmHWM` (peak RSS) over the measured steps, reset with `/proc/self/clear_refs` just before them; "
        "extra peak = VmHWM - RSS before the measured steps. Medians over repetitions.",
        "",
        "## Results",
        "",
        "| framework | median step (s) | per-rep median step (s) | RSS before (MiB) | peak RSS (MiB) "
        "| extra peak (MiB) | per-rep extra peak (MiB) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for fw in frameworks:
        d = case[fw]
        lines.append(
            f"| {names[fw]} | {d['median_step_s']:.2f} | "
            f"{', '.join(f'{x:.2f}' for x in d['median_step_s_per_rep'])} | {d['median_rss_before_mib']:.0f} | "
            f"{d['median_peak_rss_mib']:.0f} | {d['median_extra_peak_mib']:.0f} | "
            f"{', '.join(f'{x:.0f}' for x in d['extra_peak_mib_per_rep'])} |"
        )
    if "ratio_time_ours_over_trl" in case:
        lines += [
            "",
            "| ours / TRL | ratio |",
            "| --- | --- |",
            f"| step time | {case['ratio_time_ours_over_trl']:.2f} |",
            f"| peak RSS | {case['ratio_peak_rss_ours_over_trl']:.2f} |",
            f"| extra peak | {case['ratio_extra_peak_ours_over_trl']:.2f} |",
        ]
    lines += [
        "",
        "Median over the measured steps of the batch's mean reward / mean completion length (tokens): "
        + "; ".join(
            f"{names[fw]} {case[fw]['median_reward_mean']:.3f} / {case[fw]['median_completion_length_mean']:.1f}"
            for fw in frameworks
        )
        + ".",
        "",
        "## Where the time goes (median seconds per step, over all measured steps)",
        "",
        *_phase_lines(report, frameworks, lambda cs: ""),
        "",
        PHASES_NOTE,
        "",
        "## Notes",
        "",
        *_real_notes(report, case, frameworks),
        "",
        "## Machine",
        "",
        *_machine_lines(report),
        "- 1-minute load average at the start and end of each worker process: "
        + (f"{min(loads):.2f} to {max(loads):.2f}" if loads else "n/a")
        + f" (a running worker adds about its own {st['torch_threads_per_process']} threads).",
        "",
        f"Raw per-repetition numbers (every step time, RSS values, phase timings) are in `{stem}.json`.",
        "",
    ]
    return "\n".join(lines)


def _real_notes(report: dict, case: dict, frameworks: list[str]) -> list[str]:
    """The fixed notes, plus the ones this run's numbers call for (load, completion lengths, reward)."""
    st, m = report["setting"], report["machine"]
    names = _framework_names(report)
    notes = list(REAL_NOTES)
    lengths = {fw: case[fw]["median_completion_length_mean"] for fw in frameworks}
    if min(lengths.values()) >= 0.85 * st["max_new_tokens"]:
        notes.append(
            f"- Completions mostly run to the {st['max_new_tokens']}-token cap (median mean length "
            + ", ".join(f"{names[fw]} {v:.1f}" for fw, v in lengths.items())
            + "), so both frameworks generate about the same number of tokens per step (the samples differ: "
            "same seed, different samplers)."
        )
    if max(case[fw]["median_reward_mean"] for fw in frameworks) < 0.1:
        notes.append(
            "- The reward is near zero: at temperature 1.0 the untrained SmolLM2 seldom samples the right sum "
            "(its greedy accuracy is about 18%, benchmarks/results/real_model.md). The benchmark measures the "
            "cost of a step, not learning."
        )
    before = m["loadavg_before"][0]
    if before < 0.5:
        notes.append(
            f"- Taken on a quiet machine (1-minute load average {before:.2f} when the run started); the load "
            "during the run is mostly the benchmark's own worker threads."
        )
    else:
        notes.append(
            f"- The machine was shared (1-minute load average {before:.2f} when the run started): absolute "
            "times include other processes' load; the interleaved repetitions show the spread."
        )
    return notes


REAL_NOTES = [
    "- nemo_azr's `hf` generation backend keeps its own copy of the weights (a separate inference engine, "
    "refreshed by `sync_weights` after every update); that copy is part of its RSS before the measured steps.",
    "- TRL's step runs `model.generate` (no vLLM) on the training model, then its chunked LM head for the loss; "
    "with num_iterations=1 it reuses the detached current log-probs as the old ones, as nemo_azr does when it "
    "takes them from the update pass.",
]


if __name__ == "__main__":
    main()
