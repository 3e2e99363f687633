#!/usr/bin/env python
"""The self-play warm-up step with ``model.shared_prefix`` (common start) vs the plain forward, side by side.

The batch is the real one: the first supervised warm-up batch of ``azr_sandbox_smollm2`` (8 seed
goals: a templated proposal each and the scripted solver turns of its questions, about 40 rows of
230-550 prompt tokens) from the workflow's own ``sft_pairs``. Its prompts differ (each question is
its own) but all solver prompts open with the same system prompt and demonstration, and all proposer
prompts with theirs: the common start (nemo_azr/models/training/shared_prefix.py) runs each micro-batch's
shared opening once. Timed, interleaved over ``--reps`` after one uncounted pass: the warm-up step's
forward and backward (``HFPolicy.sft_step`` with a zero learning rate, so the weights stay put and
both cases see the same model). The losses and the first micro-batch's gradients are compared too.

The rollout side is timed too: the hf generation backend sampling ``--samples`` replies of up to 48
tokens (the experiment's ``solver_max_new_tokens``) to each of the batch's distinct solver prompts,
as it was (each distinct prompt encoded whole, every row decoded until the longest reply ends), with
the opening they share encoded once, and with ended rows also leaving the batch (the backend as it
is), under the same seed (the sampled tokens are compared).

    .venv/bin/python benchmarks/selfplay_warmup_prefix.py [--reps 1] [--seeds 8]

Results: benchmarks/results/selfplay_warmup_prefix.{json,md}.
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

from omegaconf import OmegaConf  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from nemo_azr.config.loader import compose_config  # noqa: E402
from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from nemo_azr.models.hf.policy import HFPolicy  # noqa: E402
from nemo_azr.models.tiny import resolve_model_path  # noqa: E402
from nemo_azr.registry import WORKFLOWS  # noqa: E402
from nemo_azr.rollout.hf_backend import HFGenerationBackend  # noqa: E402
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402
from nemo_azr.selfplay.task import build_selfplay_task  # noqa: E402

# run 22's prompt settings (docs/selfplay.md): the warm-up splits file reads into two turns
OVERRIDES = [
    "experiment=azr_sandbox_smollm2",
    "absolute_zero.sandbox_os.success_must_fit_seed=true",
    "absolute_zero.sandbox_os.proposer_sees_success=true",
    "absolute_zero.sandbox_os.warmup_read_first=true",
    "absolute_zero.sandbox_os.warmup_read_first_verbs=[cat]",
]
CASES = {"plain": ["model.shared_prefix=false"], "shared_prefix": ["model.shared_prefix=true"]}


def warmup_batch(cfg, tokenizer, seeds: int) -> tuple[Batch, list[list[int]]]:
    """The warm-up batch of the first ``seeds`` seed goals, and its distinct solver prompts."""
    task = build_selfplay_task(cfg)
    workflow = WORKFLOWS.get("azr")(task, tokenizer, cfg)
    pairs = workflow.sft_pairs(task.examples[:seeds])
    proposer = {
        tuple(encode_prompt(tokenizer, workflow.domain.proposer_messages(ex, 3))) for ex in task.examples
    }
    solver = [list(p) for p in dict.fromkeys(tuple(p) for p, _ in pairs) if p not in proposer]
    prompts, targets = zip(*pairs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Batch(pack_prompt_response(prompts, targets, None, pad_id=pad)), solver


class WholePromptBackend(HFGenerationBackend):
    """The reference: each distinct prompt encoded whole (its ``n`` samples still share it)."""

    def _encode_distinct(self, ids, attn, pos):
        return (*self._next_logits(ids, attn, pos, None), attn)


def time_generation(model, tokenizer, prompts: list[list[int]], samples: int, reps: int) -> dict:
    """Seconds per generate call (median over ``reps``) of three backends, in one process, interleaved:
    ``before`` (each distinct prompt encoded whole, every row decoded to the longest reply's end),
    ``common_start`` (the opening the prompts share encoded once) and ``common_start_pruned`` (the
    backend as it is: also ended rows leave the batch)."""
    requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompts)]
    sampling = SamplingParams(n=samples, temperature=0.7, max_new_tokens=48)
    backends = {
        "before": WholePromptBackend(model, tokenizer),
        "common_start": HFGenerationBackend(model, tokenizer),
        "common_start_pruned": HFGenerationBackend(model, tokenizer),
    }
    backends["before"].prune_ended_share = backends["common_start"].prune_ended_share = 2.0  # never
    times: dict[str, list[float]] = {n: [] for n in backends}
    tokens: dict[str, list] = {}
    for rep in range(reps + 1):
        for name, backend in backends.items():
            torch.manual_seed(rep)
            start = time.perf_counter()
            with torch.inference_mode():
                tokens[name] = [s.token_ids for o in backend.generate(requests, sampling) for s in o.samples]
            seconds = time.perf_counter() - start
            if rep:
                times[name].append(seconds)
            print(f"  generate {name}: {seconds:.1f} s", flush=True)
    ref = tokens["before"]
    lengths = [len(t) for t in ref]
    return {
        "median_s": {n: statistics.median(v) for n, v in times.items()},
        "same_tokens_frac": {n: sum(a == b for a, b in zip(tokens[n], ref)) / len(ref) for n in backends},
        "prompts": len(prompts),
        "samples": samples,
        "generated_tokens": sum(lengths),
        "reply_len_mean": sum(lengths) / len(lengths),
        "reply_at_max_frac": sum(n == sampling.max_new_tokens for n in lengths) / len(lengths),
    }


def first_micro_batch_grads(policy: HFPolicy, batch: Batch) -> list[torch.Tensor]:
    """Gradients of the summed NLL of the batch's 8 longest rows (the warm-up's first micro-batch)."""
    from nemo_azr.models.training.microbatch import trim_padding

    order = torch.argsort(batch[F.ATTENTION_MASK].sum(dim=1), descending=True, stable=True)
    part, _ = trim_padding(batch.index(order[: policy.micro_batch_rows()]))
    policy.model.zero_grad(set_to_none=True)
    (-(policy.token_logprobs(part) * part[F.LOSS_MASK]).sum()).backward()
    grads = [p.grad.detach().clone() for p in policy.model.parameters() if p.grad is not None]
    policy.model.zero_grad(set_to_none=True)
    return grads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seeds", type=int, default=8, help="seed goals in the batch (the experiment's warm-up batch_size)"
    )
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--samples", type=int, default=5, help="replies per solver prompt (generation.n_samples)"
    )
    parser.add_argument(
        "--rollout-only",
        action="store_true",
        help="time the rollout only; keep the warm-up numbers of the committed results",
    )
    args = parser.parse_args()
    previous = (
        json.loads((RESULTS_DIR / "selfplay_warmup_prefix.json").read_text()) if args.rollout_only else None
    )

    base = OmegaConf.to_object(compose_config(OVERRIDES))
    path = resolve_model_path(base.model.path, base.model.tiny)
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch, solver = warmup_batch(base, tokenizer, args.seeds)
    torch.set_num_threads(base.trainer.num_threads)
    policies = {}
    for name, ov in CASES.items():
        cfg = OmegaConf.to_object(compose_config([*OVERRIDES, *ov]))
        policies[name] = HFPolicy(path, cfg)
    times: dict[str, list[float]] = {n: [] for n in policies}
    losses: dict[str, float] = {}
    for rep in range(0 if previous else args.reps + 1):  # rep 0 warms up: not counted
        for name, policy in policies.items():
            optimizer = torch.optim.SGD(policy.model.parameters(), lr=0.0)
            start = time.perf_counter()
            losses[name] = policy.sft_step(batch, optimizer)
            seconds = time.perf_counter() - start
            if rep:
                times[name].append(seconds)
            print(f"  {name}: warm-up step {seconds:.1f} s, loss {losses[name]:.6f}", flush=True)
    if previous:
        med, losses = previous["median_s"], previous["loss"]
        grad_diff, grad_scale = previous["grad_max_abs_diff"], previous["grad_max_abs"]
    else:
        grads = {n: first_micro_batch_grads(p, batch) for n, p in policies.items()}
        grad_diff = max(float((a - b).abs().max()) for a, b in zip(grads["plain"], grads["shared_prefix"]))
        grad_scale = max(float(a.abs().max()) for a in grads["plain"])
        med = {n: statistics.median(v) for n, v in times.items()}
    gen = time_generation(policies["plain"].model, tokenizer, solver, args.samples, args.reps)
    real = batch[F.ATTENTION_MASK]
    out = {
        "meta": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "mem_gib": mem_total_gib(),
            "torch": torch.__version__,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "args": " ".join(sys.argv[1:]),
            "model": str(base.model.path),
        },
        "batch": {
            "rows": len(batch),
            "real_tokens": int(real.sum()),
            "trained_tokens": int(batch[F.LOSS_MASK].sum()),
            "micro_batch_rows": policies["plain"].micro_batch_rows(),
        },
        "median_s": med,
        "speedup": round(med["plain"] / med["shared_prefix"], 2),
        "loss": losses,
        "grad_max_abs_diff": grad_diff,
        "grad_max_abs": grad_scale,
        "generate": gen,
        # the warm-up's machine and date, kept with its numbers when only the rollout was timed
        "warmup_measured": (previous.get("warmup_measured") or previous["meta"]) if previous else None,
    }
    gm = gen["median_s"]
    m = out["meta"]
    lines = [
        "# Self-play warm-up step with a common start (`model.shared_prefix`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['mem_gib']:.0f} GiB, CPU only (torch {m['torch']}); run {m['date']}.  ",
        f"Command: `python benchmarks/selfplay_warmup_prefix.py {m['args']}`. Model: {m['model']} (float32). "
        "Both cases in one process, interleaved after one uncounted pass.",
        "",
        f"Batch: the first supervised warm-up batch of `azr_sandbox_smollm2` (run 22's prompt settings), "
        f"{args.seeds} seed goals: {out['batch']['rows']} rows, {out['batch']['real_tokens']} real tokens, "
        f"{out['batch']['trained_tokens']} trained, {out['batch']['micro_batch_rows']} rows per micro-batch "
        "(sorted by length, as the warm-up does).",
        "",
        "| pass | plain s | shared prefix s | speed-up |",
        "| --- | --- | --- | --- |",
        f"| warm-up step (forward + backward) | {med['plain']:.1f} | {med['shared_prefix']:.1f} | {out['speedup']:.2f}x |",
        "",
        f"Loss: {losses['plain']:.6f} plain, {losses['shared_prefix']:.6f} shared; largest gradient "
        f"difference on the first micro-batch (8 rows, summed NLL): {grad_diff:.2e}, against a largest "
        f"gradient of {grad_scale:.2e} (fp32).",
        "",
        *(
            [
                f"The warm-up numbers above are from the run of {out['warmup_measured']['date']}; the rollout's below from this one.",
                "",
            ]
            if out["warmup_measured"]
            else []
        ),
        f"Rollout (hf backend, float32, {gen['samples']} replies of up to 48 tokens at temperature 0.7 to each "
        f"of the batch's {gen['prompts']} distinct solver prompts by the untrained model: {gen['generated_tokens']} "
        f"tokens, {gen['reply_len_mean']:.1f} a reply, {100 * gen['reply_at_max_frac']:.0f}% of the replies cut "
        "at 48):",
        "",
        "| generate | seconds | speed-up | same tokens as before |",
        "| --- | --- | --- | --- |",
        *[
            f"| {label} | {gm[key]:.1f} | {gm['before'] / gm[key]:.2f}x | {100 * gen['same_tokens_frac'][key]:.0f}% |"
            for key, label in (
                ("before", "before: each prompt whole, every row to the end"),
                ("common_start", "the shared opening once"),
                ("common_start_pruned", "the shared opening once, ended rows leave the batch"),
            )
        ],
        "",
        "Same seed for every case; a reply that differs does so by a sampling flip at fp32 rounding.",
        "",
    ]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "selfplay_warmup_prefix.json").write_text(json.dumps(out, indent=2) + "\n")
    (RESULTS_DIR / "selfplay_warmup_prefix.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
