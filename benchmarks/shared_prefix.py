#!/usr/bin/env python
"""Shared-prefix training forward (``model.shared_prefix``) vs the plain padded forward, side by side.

The batch has the layout of an RLCR two-turn step's confidence rows on SmolLM2 (``--model``): each
of ``--contexts`` turn-2 contexts (``--context-len`` tokens: chat template, demonstrations, the
question, the answer, the confidence request) is followed by ``--per-context`` sampled
confidences of ``--response-len`` tokens, which alone are trained. Timed, interleaved over
``--reps``: the forward+backward of the update (``accumulate_gradients``) and the no-grad
log-prob pass (``compute_logprobs``), at ``algorithm.micro_batch_size`` rows per micro-batch (a
multiple of ``--per-context``, so a context's rows share a micro-batch). The gradients of the two
cases are compared too (max abs difference), so the speed-up is for the same result.

The rollout side is timed too: the hf generation backend sampling ``--per-context`` replies of
``--response-len`` tokens for each context, with every distinct prompt encoded once (what the backend
does) against every row encoding its own copy, under the same seed (the sampled tokens are compared).

    .venv/bin/python benchmarks/shared_prefix.py
    python benchmarks/shared_prefix.py --device cuda --model DIR --results-name shared_prefix_h100

Results: benchmarks/results/shared_prefix.{json,md} (``--results-name`` for another name).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from machine import cpu_model, mem_total_gib
from real_model import RESULTS_DIR

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from nemo_azr.models.hf.policy import HFPolicy  # noqa: E402
from nemo_azr.models.tiny import resolve_model_path  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.rollout.hf_backend import HFGenerationBackend  # noqa: E402

CASES = {"plain": [], "shared_prefix": ["model.shared_prefix=true"]}


def rlcr_batch(contexts: int, per_context: int, context_len: int, response_len: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    ctx = [
        torch.randint(10, vocab, (context_len - 8 * (i % 3),), generator=g).tolist() for i in range(contexts)
    ]
    prompts = [c for c in ctx for _ in range(per_context)]
    lens = torch.randint(max(1, response_len // 2), response_len + 1, (len(prompts),), generator=g).tolist()
    responses = [torch.randint(10, vocab, (n,), generator=g).tolist() for n in lens]
    t = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = t[F.LOSS_MASK]
    t[F.ADVANTAGES] = torch.randn(mask.shape, generator=g) * mask
    t[F.OLD_LOGPROBS] = (-torch.rand(mask.shape, generator=g) - 1.0) * mask
    return Batch(t, {F.UID: [str(i) for i in range(len(prompts))]})


class PerRowPromptBackend(HFGenerationBackend):
    """The reference: every row encodes its own copy of its prompt."""

    def _encode_prompts(self, ids, attn, pos):
        return (*self._next_logits(ids, attn, pos, None), attn)


def time_generation(model, tokenizer, batch: Batch, args) -> dict:
    """Seconds per generate call (median over ``--reps``) with shared and per-row prompt encoding."""
    dtype = getattr(torch, args.gen_dtype) if args.gen_dtype else None
    prompts = [list(p) for p in dict.fromkeys(tuple(row) for row in _prompt_rows(batch))]
    requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompts)]
    sampling = SamplingParams(n=args.per_context, temperature=1.0, max_new_tokens=args.response_len)
    backends = {
        "shared": HFGenerationBackend(model, tokenizer, dtype=dtype),
        "per_row": PerRowPromptBackend(model, tokenizer, dtype=dtype),
    }
    times: dict[str, list[float]] = {n: [] for n in backends}
    tokens: dict[str, list] = {}
    for rep in range(args.reps + 1):
        for name, backend in backends.items():
            torch.manual_seed(rep)
            with torch.inference_mode():
                t = _timed(
                    lambda b=backend, n=name: tokens.__setitem__(n, b.generate(requests, sampling)),
                    args.device,
                )
            if rep:
                times[name].append(t)
            print(f"  generate {name}: {t:.2f} s", flush=True)
    a = [s.token_ids for o in tokens["shared"] for s in o.samples]
    b = [s.token_ids for o in tokens["per_row"] for s in o.samples]
    return {
        "median_s": {n: statistics.median(v) for n, v in times.items()},
        "same_tokens_frac": sum(x == y for x, y in zip(a, b)) / len(a),
        "dtype": args.gen_dtype or "float32",
    }


def _prompt_rows(batch: Batch) -> list[list[int]]:
    """Each row's tokens before its first trained token (its turn-2 context)."""
    rows = []
    for ids, mask, attn in zip(batch[F.INPUT_IDS], batch[F.LOSS_MASK], batch[F.ATTENTION_MASK]):
        first = int(mask.nonzero()[0])
        rows.append([int(t) for t, a in zip(ids[:first], attn[:first]) if a])
    return rows


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed(fn, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", help="a model preset, folder or 'tiny'")
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--per-context", type=int, default=4)
    parser.add_argument("--context-len", type=int, default=330)
    parser.add_argument("--response-len", type=int, default=24)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--results-name", default="shared_prefix")
    parser.add_argument("--gen-dtype", default="bfloat16", help="the rollout copy's dtype ('' = float32)")
    args = parser.parse_args()

    path = resolve_model_path(args.model, load_config([]).model.tiny)
    base = [f"algorithm.micro_batch_size={args.micro_batch_size}", "algorithm.kl.coef=0"]
    policies = {
        name: HFPolicy(path, load_config([*base, *ov]), device=args.device) for name, ov in CASES.items()
    }
    vocab = policies["plain"].model.config.vocab_size
    batch = rlcr_batch(args.contexts, args.per_context, args.context_len, args.response_len, vocab)
    n_tok = float(batch[F.LOSS_MASK].sum())
    times: dict[str, dict[str, list[float]]] = {n: {"update": [], "logprobs": []} for n in policies}
    for rep in range(args.reps + 1):  # rep 0 warms up: not counted
        for name, policy in policies.items():
            policy.model.zero_grad(set_to_none=True)
            up = _timed(
                lambda p=policy: p.accumulate_gradients(batch, num_tokens=n_tok, norm_length=64), args.device
            )
            lp = _timed(lambda p=policy: p.compute_logprobs(batch), args.device)
            if rep:
                times[name]["update"].append(up)
                times[name]["logprobs"].append(lp)
            print(f"  {name}: update {up:.2f} s, logprobs {lp:.2f} s", flush=True)
    from transformers import AutoTokenizer

    gen = time_generation(policies["plain"].model, AutoTokenizer.from_pretrained(path), batch, args)
    grad_diff = max(
        float((a.grad - b.grad).abs().max())
        for a, b in zip(policies["plain"].model.parameters(), policies["shared_prefix"].model.parameters())
        if a.grad is not None
    )
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    out = {
        "meta": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "mem_gib": mem_total_gib(),
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "args": " ".join(sys.argv[1:]),
        },
        "batch": {
            "rows": len(batch),
            "width": batch.seq_len,
            "contexts": args.contexts,
            "per_context": args.per_context,
            "context_len": args.context_len,
            "response_len_max": args.response_len,
            "trained_tokens": int(n_tok),
        },
        "median_s": med,
        "speedup": {k: round(med["plain"][k] / med["shared_prefix"][k], 2) for k in ("update", "logprobs")},
        "grad_max_abs_diff": grad_diff,
        "generate": gen,
    }
    gen_med = gen["median_s"]
    m = out["meta"]
    accel = f"GPU: {m['gpu']}" if m["gpu"] else "CPU only"
    lines = [
        "# Shared-prefix training forward (`model.shared_prefix`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']:.0f} GiB, {accel} (torch {m['torch']}); "
        f"run {m['date']}.  ",
        f"Command: `python benchmarks/shared_prefix.py {m['args']}`. Model: {args.model}. Both cases in "
        "one process, interleaved; ratios side by side.",
        "",
        f"Batch: {args.contexts} contexts of about {args.context_len} tokens x {args.per_context} sampled "
        f"continuations of up to {args.response_len} tokens ({len(batch)} rows, width {batch.seq_len}; "
        f"{int(n_tok)} trained tokens), {args.micro_batch_size} rows per micro-batch: the layout of an RLCR "
        "two-turn step's confidence rows.",
        "",
        "| pass | plain s | shared prefix s | speed-up |",
        "| --- | --- | --- | --- |",
        *[
            f"| {k} | {med['plain'][k]:.3f} | {med['shared_prefix'][k]:.3f} | {out['speedup'][k]}x |"
            for k in ("update", "logprobs")
        ],
        "",
        f"Largest gradient difference between the two: {grad_diff:.2e} (fp32).",
        "",
        f"Rollout (hf backend, {gen['dtype']} copy, {args.per_context} replies of {args.response_len} tokens "
        "per context, temperature 1):",
        "",
        "| pass | prompt per row s | prompt once s | speed-up |",
        "| --- | --- | --- | --- |",
        f"| generate | {gen_med['per_row']:.3f} | {gen_med['shared']:.3f} | "
        f"{gen_med['per_row'] / gen_med['shared']:.2f}x |",
        "",
        f"Same seed, same sampled tokens in {gen['same_tokens_frac']:.0%} of the replies.",
        "",
    ]
    name = args.results_name
    (RESULTS_DIR / f"{name}.md").write_text("\n".join(lines))
    (RESULTS_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
