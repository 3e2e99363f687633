"""Tokens/s of one RL update step (forward + backward + AdamW) on a ~0.5B model: megatron vs hf.

A Qwen2-0.5B-shaped model (hidden 896, 24 layers, 14 heads, 2 kv heads, ffn 4864, vocab 151936)
is built from its config with random weights (no hub download) and saved locally; both policy
backends load it and run ``policy.update`` on the same synthetic PPO batch (prompts + responses of
random tokens, random advantages, old log-probs from the policy). Warm-up steps are excluded;
reported: median step time, trained tokens/s (response tokens) and processed tokens/s (all real
tokens), peak GPU memory, and the megatron/hf ratios measured side by side in this run. Also the
no-grad log-prob forward (old / reference log-probs) tokens/s.

    python benchmarks/megatron_tokens_per_s.py                     # GPU: bf16, writes results/
    python benchmarks/megatron_tokens_per_s.py --tiny --out /tmp/x  # CPU smoke run of the script

Writes benchmarks/results/megatron_tokens_per_s.{json,md} unless ``--out`` names another folder.
One process (TP=PP=DP=1): the 0.5B model fits one GPU; the layouts' speed needs several GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import cpu_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def build_model(folder: Path, shape: dict, dtype: torch.dtype) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if (folder / "config.json").is_file():
        return folder
    config = Qwen2Config(**shape, rms_norm_eps=1e-6, rope_theta=1e6, torch_dtype=str(dtype).split(".")[-1])
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(dtype).save_pretrained(str(folder))
    return folder


def synthetic_batch(vocab: int, rows: int, prompt_len: int, response_len: int):
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.assemble import pack_prompt_response

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (prompt_len,), generator=g).tolist() for _ in range(rows)]
    # Response lengths vary like real rollouts (a quarter to all of response_len).
    lengths = torch.randint(response_len // 4, response_len + 1, (rows,), generator=g).tolist()
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
    batch = Batch(pack_prompt_response(prompts, responses, None, pad_id=0))
    batch[F.ADVANTAGES] = torch.randn(batch[F.LOSS_MASK].shape, generator=g) * batch[F.LOSS_MASK]
    return batch


def config(model_dir: Path, backend: str, dtype: str, micro: int, logprob_micro: int = 0):
    from nemo_azr.preflight import load_config

    return load_config(
        [
            f"algorithm.logprob_micro_batch_size={logprob_micro}",
            f"model.backend={backend}",
            f"model.path={model_dir}",
            f"model.dtype={dtype}",
            "logger=quiet",
            "trainer.device=auto",
            f"algorithm.micro_batch_size={micro}",
            "algorithm.ppo_epochs=1",
            "algorithm.mini_batch_size=0",
            "optim.lr=1e-6",
        ]
    )


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _profile_logprobs(backend: str, policy, batch) -> None:
    """One log-prob forward profiled: top CUDA kernels, and the host's top ops by self CPU time (a
    host sync shows as cudaStreamSynchronize / cudaMemcpyAsync time; launch-bound work as CPU time
    well above the kernels' CUDA time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        policy.compute_logprobs(batch)
        sync()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    # kernel rows only: an op's row repeats the time of the kernels it launched
    kernels = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
    print(
        f"profile: {backend} log-prob forward, wall {wall:.3f} s (profiled), kernels {kernels:.3f} s",
        flush=True,
    )
    for key in ("self_cuda_time_total", "self_cpu_time_total"):
        print(events.table(sort_by=key, row_limit=25, max_name_column_width=70), flush=True)


def measure(backend: str, model_dir: Path, batch, args) -> dict:
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.update import UpdateContext
    from nemo_azr.registry import POLICY_BACKENDS

    if backend == "megatron":
        import nemo_azr.models.megatron  # noqa: F401  (registers the backend)
    cfg = config(model_dir, backend, args.dtype, args.micro_batch_size, args.logprob_micro_batch_size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    policy = POLICY_BACKENDS.get(backend)(model_dir, cfg, trainable=True, device=device)
    policy.setup_optimizer(total_steps=args.warmup + args.steps)
    batch[F.OLD_LOGPROBS] = policy.compute_logprobs(batch)
    norm_length = batch.seq_len
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    step_s, logprob_s = [], []
    for i in range(args.warmup + args.steps):
        sync()
        start = time.perf_counter()
        policy.update(batch, UpdateContext(norm_length=norm_length))
        sync()
        mid = time.perf_counter()
        policy.compute_logprobs(batch)
        sync()
        if i >= args.warmup:
            step_s.append(mid - start)
            logprob_s.append(time.perf_counter() - mid)
    if args.profile and torch.cuda.is_available():
        _profile_logprobs(backend, policy, batch)
    trained = float(batch[F.LOSS_MASK].sum())
    real = float(batch[F.ATTENTION_MASK].sum())
    step, lp = statistics.median(step_s), statistics.median(logprob_s)
    out = {
        "logprob_forwards": len(policy.micro_batches(batch, no_grad=True)),
        "step_s": step,
        "trained_tokens_per_s": trained / step,
        "tokens_per_s": real / step,
        "logprob_tokens_per_s": real / lp,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
    }
    del policy
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shape, fp32, 2 steps (CPU smoke run)")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--response-len", type=int, default=768)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument(
        "--logprob-micro-batch-size",
        type=int,
        default=0,
        help="algorithm.logprob_micro_batch_size: rows per no-grad log-prob forward (0: the default, by the "
        "memory budget on CUDA, the training micro-batches on a CPU)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--model-dir", default="/tmp/qwen2_05b_random")
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument(
        "--profile",
        action="store_true",
        help="profile one log-prob forward per backend: top kernels and host ops",
    )
    args = parser.parse_args()
    shape = QWEN2_05B
    if args.tiny:
        shape = TINY
        args.rows, args.prompt_len, args.response_len, args.micro_batch_size = 4, 8, 16, 2
        args.warmup, args.steps, args.dtype = 1, 2, "float32"
        args.model_dir = args.model_dir + "_tiny"
    dtype = getattr(torch, args.dtype)
    model_dir = build_model(Path(args.model_dir), shape, dtype)
    results = {
        name: measure(
            name,
            model_dir,
            synthetic_batch(shape["vocab_size"], args.rows, args.prompt_len, args.response_len),
            args,
        )
        for name in ("hf", "megatron")
    }
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_model()
    ratio = {
        key: results["megatron"][key] / results["hf"][key]
        for key in ("trained_tokens_per_s", "tokens_per_s", "logprob_tokens_per_s")
    }
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "shape": shape,
        "args": vars(args),
        "results": results,
        "megatron_over_hf": ratio,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "megatron_tokens_per_s.json").write_text(json.dumps(record, indent=2) + "\n")
    rows = "\n".join(
        f"| {name} | {r['step_s']:.3f} | {r['trained_tokens_per_s']:.0f} | {r['tokens_per_s']:.0f} | {r['logprob_forwards']} | "
        f"{r['logprob_tokens_per_s']:.0f} | {r['peak_mem_gib'] if r['peak_mem_gib'] is None else round(r['peak_mem_gib'], 1)} |"
        for name, r in results.items()
    )
    (out / "megatron_tokens_per_s.md").write_text(
        f"# RL update tokens/s, {'tiny smoke' if args.tiny else 'Qwen2-0.5B-shaped'} model, one process\n\n"
        f"Date (UTC): {record['date']}  \nDevice: {device}, torch {torch.__version__}, {args.dtype}  \n"
        f"Command: `python benchmarks/megatron_tokens_per_s.py {' '.join(sys.argv[1:])}`\n\n"
        f"{args.rows} rows of {args.prompt_len} prompt + up to {args.response_len} response tokens; "
        f"micro-batch {args.micro_batch_size}"
        f"{f', log-prob micro-batch {args.logprob_micro_batch_size}' if args.logprob_micro_batch_size else ''}"
        f"; median of {args.steps} steps after {args.warmup} warm-up.\n\n"
        "| backend | update step s | trained tok/s | processed tok/s | log-prob forwards | log-prob forward tok/s | peak GiB |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        f"{rows}\n\n"
        "megatron/hf: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()) + "\n"
    )
    print((out / "megatron_tokens_per_s.md").read_text())


if __name__ == "__main__":
    main()
