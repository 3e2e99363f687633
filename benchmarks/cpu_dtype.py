#!/usr/bin/env python
"""float32 vs bfloat16 on this CPU for SmolLM2-135M: generation tokens/s and one training step.

Side by side in one run, same prompts and weights: the hf generation backend decodes a batch greedily
(KV cache), and the hf policy does one forward + backward of the GRPO loss on the generated rows. Also
checks whether a bf16 AdamW step at a real-model learning rate changes the weights at all (the reason
the trainer keeps fp32 on CPU). Writes benchmarks/results/cpu_dtype.{json,md}.

    .venv/bin/python benchmarks/cpu_dtype.py [--model-path DIR] [--reps 3]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import time
from pathlib import Path

import torch
from machine import cpu_model, mem_total_gib

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
PROMPTS = 32
NEW_TOKENS = 32
LR = 2e-6


def _prompts(tokenizer) -> list[list[int]]:
    from nemo_azr.rollout.single_turn import encode_prompt

    return [
        encode_prompt(
            tokenizer,
            [{"role": "user", "content": f"What is {10 + i} + {50 + 2 * i}? Reply with just the number."}],
        )
        for i in range(PROMPTS)
    ]


def measure(model_path: str, dtype: torch.dtype, reps: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
    from nemo_azr.rollout.hf_backend import HFGenerationBackend

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    backend = HFGenerationBackend(model, tokenizer)
    requests = [GenerationRequest(p, i) for i, p in enumerate(_prompts(tokenizer))]
    sampling = SamplingParams(n=1, max_new_tokens=NEW_TOKENS, greedy=True)
    backend.generate(requests[:4], sampling)  # warm-up
    gen_s, tokens, outputs = [], 0, None
    for _ in range(reps):
        start = time.perf_counter()
        outputs = backend.generate(requests, sampling)
        gen_s.append(time.perf_counter() - start)
    tokens = sum(len(o.samples[0].token_ids) for o in outputs)
    texts = [o.samples[0].text for o in outputs]

    # one forward + backward over prompt + response (the update's cost), mean token log-prob loss
    rows = [r.prompt_ids + o.samples[0].token_ids for r, o in zip(requests, outputs)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    attn = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)], attn[i, : len(row)] = torch.tensor(row), 1
    model.train()
    step_s = []
    for _ in range(reps):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logits = model(input_ids=ids, attention_mask=attn).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(), reduction="mean"
        )
        loss.backward()
        step_s.append(time.perf_counter() - start)
    # does one AdamW step at the real-model lr move the weights in this dtype?
    weight = model.get_input_embeddings().weight
    before = weight.detach().clone()
    torch.optim.AdamW(model.parameters(), lr=LR).step()
    moved = (weight.detach() != before).float().mean().item()
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "generate_s_median": round(statistics.median(gen_s), 3),
        "generated_tokens": tokens,
        "generate_tokens_per_s": round(tokens / statistics.median(gen_s), 1),
        "fwd_bwd_s_median": round(statistics.median(step_s), 3),
        "adamw_step_moved_fraction": round(moved, 4),
        "texts": texts[:3],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", default="smollm2-135m", help="a model folder or preset")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from nemo_azr.config.schema import TinyModelConfig
    from nemo_azr.models.tiny import resolve_model_path

    path = str(resolve_model_path(args.model_path, TinyModelConfig()))
    results = [measure(path, dtype, args.reps) for dtype in (torch.float32, torch.bfloat16)]
    fp32, bf16 = results
    summary = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "mem_gib": round(mem_total_gib(), 1),
            "flags": sorted(
                {
                    f
                    for f in Path("/proc/cpuinfo").read_text().split()
                    if f in ("avx512_bf16", "amx_bf16", "avx2")
                }
            ),
        },  # fmt: skip
        "threads": args.threads,
        "setting": f"{PROMPTS} prompts, greedy, {NEW_TOKENS} new tokens max; fwd+bwd of the {PROMPTS} rows; AdamW lr {LR}",
        "results": results,
        "bf16_over_fp32": {
            "generate_speed": round(bf16["generate_tokens_per_s"] / fp32["generate_tokens_per_s"], 2),
            "fwd_bwd_speed": round(fp32["fwd_bwd_s_median"] / bf16["fwd_bwd_s_median"], 2),
        },
        "same_greedy_texts_of_first_3": fp32["texts"] == bf16["texts"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cpu_dtype.json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = [
        "# float32 vs bfloat16 on CPU (SmolLM2-135M-Instruct)",
        "",
        f"Date (UTC): {summary['date']}  ",
        f"Machine: {summary['machine']['cpu']}, {summary['machine']['cores']} cores, flags {summary['machine']['flags']}, "
        f"{args.threads} torch threads  ",
        "Command: `.venv/bin/python benchmarks/cpu_dtype.py`  ",
        f"Setting: {summary['setting']}; medians of {args.reps} repetitions, both dtypes in one run.",
        "",
        "| dtype | generate tokens/s | fwd+bwd (s) | AdamW step at lr 2e-6: share of embedding weights changed |",
        "| --- | --- | --- | --- |",
        *[
            f"| {r['dtype']} | {r['generate_tokens_per_s']} | {r['fwd_bwd_s_median']} | {r['adamw_step_moved_fraction']:.4f} |"
            for r in results
        ],
        "",
        f"bf16 / fp32: generation speed x{summary['bf16_over_fp32']['generate_speed']}, forward+backward speed "
        f"x{summary['bf16_over_fp32']['fwd_bwd_speed']}; first 3 greedy texts equal: {summary['same_greedy_texts_of_first_3']}.",
    ]
    (RESULTS / "cpu_dtype.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
