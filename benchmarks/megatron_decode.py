#!/usr/bin/env python
"""Rollout decode speed of the megatron generation backend: megatron-core's loop against the static path.

    python benchmarks/megatron_decode.py --model DIR [--prompts 64] [--n 8] [--new-tokens 128]

One megatron policy (the HF folder ``--model`` loaded into a megatron ``GPTModel``, one GPU), cases
side by side in one process:
* ``dynamic``  megatron-core's static inference loop (``generation.decode=dynamic``);
* ``static``   rollout/megatron_static_decode.py: its own cache, the step replayed from a CUDA graph
  (``generation.decode=auto`` on CUDA);
* ``hf_static`` the hf backend's static path on the policy's HF export (what a megatron job's default
  rollout, ``generation.backend=hf``, decodes with), for reference.

Per case: generated tokens/s (median of ``--reps`` calls after a warm-up call) and peak GPU memory;
greedy rows against ``dynamic`` in the model's dtype and, on ``--fp32-prompts`` prompts, in float32;
the largest gap between a sampled token's log-prob and the trainer's teacher-forced one. Writes
results/<--results-name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import RESULTS, _agreement, _prompts, _timed  # noqa: E402

from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402


def _policy(model_dir: Path, dtype: str, device: str):
    from nemo_azr.config.schema import NemoAzrConfig
    from nemo_azr.models.megatron.policy import MegatronPolicy

    cfg = NemoAzrConfig()
    cfg.model.backend = "megatron"
    cfg.model.dtype = dtype
    cfg.parallel.use_te = "false"
    cfg.generation.temperature = 1.0
    return MegatronPolicy(model_dir, cfg, trainable=False, device=device)


def _backend(policy, tok, case: str):
    from nemo_azr.rollout.hf_backend import HFGenerationBackend
    from nemo_azr.rollout.megatron_backend import MegatronGenerationBackend

    if case == "hf_static":
        return HFGenerationBackend(policy.generation_model(), tok, decode="static")
    return MegatronGenerationBackend(policy, tok, decode=case)


def _logprob_gap(policy, requests, samples, n: int, pad_id: int) -> float:
    """Max |rollout log-prob - the trainer's teacher-forced log-prob| over the first 32 sampled rows."""
    rows = [requests[i // n].prompt_ids for i in range(min(32, len(samples)))]
    kept = samples[: len(rows)]
    batch = Batch(
        pack_prompt_response(rows, [s.token_ids for s in kept], [s.logprobs for s in kept], pad_id=pad_id)
    )
    trainer = policy.compute_logprobs(batch).cpu().float()
    return float((batch[F.ROLLOUT_LOGPROBS] - trainer).abs().max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fp32-prompts", type=int, default=16)
    ap.add_argument("--results-name", default="megatron_decode_gpu")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from nemo_azr.distributed.parallel import destroy_parallel

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = _prompts(tok, args.prompts)
    requests = [GenerationRequest(p) for p in prompts]
    sampled = SamplingParams(n=args.n, temperature=1.0, max_new_tokens=args.new_tokens)
    greedy = SamplingParams(n=args.n, greedy=True, max_new_tokens=args.new_tokens)
    cases = ["dynamic", "static", "hf_static"]

    rows: dict[str, dict] = {}
    greedy_out: dict[str, list] = {}
    fp32: dict[str, list] = {}
    for fp32_check in (False, True):
        policy = _policy(args.model, "float32" if fp32_check else args.dtype, str(device))
        for case in cases:
            try:
                backend = _backend(policy, tok, case)
                if fp32_check:  # greedy equality without low-precision rounding
                    small = SamplingParams(n=1, greedy=True, max_new_tokens=args.new_tokens)
                    fp32[case] = _timed(backend, requests[: args.fp32_prompts], small, device)[1]
                    write_results(args, rows, greedy_out, fp32, device)
                    continue
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                _timed(backend, requests, sampled, device)  # warm-up: graphs recorded
                times = []
                for _ in range(args.reps):
                    seconds, samples = _timed(backend, requests, sampled, device)
                    times.append(seconds)
                tokens = sum(len(s.token_ids) for s in samples)
                rows[case] = {
                    "tokens_per_s": round(tokens / statistics.median(times)),
                    "seconds": round(statistics.median(times), 3),
                    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                    if device.type == "cuda"
                    else None,
                    "logprob_gap": _logprob_gap(policy, requests, samples, args.n, tok.pad_token_id),
                }
                print(case, rows[case], flush=True)
                write_results(args, rows, greedy_out, fp32, device)
                greedy_out[case] = _timed(backend, requests, greedy, device)[1]
                write_results(args, rows, greedy_out, fp32, device)
            except Exception as exc:  # noqa: BLE001 - a failing case keeps the others
                print(
                    f"{'float32 ' if fp32_check else ''}{case} failed: {type(exc).__name__}: {exc}",
                    flush=True,
                )
        del policy
        destroy_parallel()

    write_results(args, rows, greedy_out, fp32, device)


def write_results(args, rows: dict, greedy_out: dict, fp32: dict, device: torch.device) -> None:
    """results/<name>.{json,md} from the cases measured so far (called after each one, so a run
    stopped by a time limit keeps what it measured)."""
    if "dynamic" not in rows:
        return
    base = rows["dynamic"]["tokens_per_s"]
    for case, row in rows.items():
        row["speedup"] = round(row["tokens_per_s"] / base, 2)
        if case in greedy_out:
            row["greedy_vs_dynamic"] = _agreement(greedy_out["dynamic"], greedy_out[case])
        if case in fp32 and "dynamic" in fp32:
            row["greedy_vs_dynamic_fp32"] = _agreement(fp32["dynamic"], fp32[case])
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "torch": torch.__version__,
        "args": {k: str(v) for k, v in vars(args).items()},
        "results": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.results_name}.json").write_text(json.dumps(record, indent=2) + "\n")

    def agreement(r: dict, key: str) -> str:
        a = r.get(key)
        return f"{a['rows_identical']}/{a['rows']}" if a else "-"

    table = "\n".join(
        f"| {c} | {r['tokens_per_s']} | {r['speedup']}x | {r['peak_gib']} | {agreement(r, 'greedy_vs_dynamic')} | "
        f"{agreement(r, 'greedy_vs_dynamic_fp32')} | {r['logprob_gap']:.2e} |"
        for c, r in rows.items()
    )
    (args.out / f"{args.results_name}.md").write_text(
        f"# megatron generation backend: rollout decode, {args.prompts} x {args.n} rows x {args.new_tokens} tokens\n\n"
        f"Date (UTC): {record['date']}; device: {name}; torch {torch.__version__}; {args.dtype}\n\n"
        "| case | generated tok/s | vs dynamic | peak GiB | greedy rows = dynamic | float32 greedy rows = dynamic | max log-prob gap vs trainer |\n"
        "| --- | --- | --- | --- | --- | --- | --- |\n"
        f"{table}\n"
    )
    print((args.out / f"{args.results_name}.md").read_text(), flush=True)


if __name__ == "__main__":
    main()
