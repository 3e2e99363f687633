"""HF vs megatron parity of a local HF folder at a TP / PP layout; weights, greedy text and training
steps of HF folders / runs compared.

A by-hand check for real checkpoints (CI runs the same functions on tiny models; the commands used
on SmolLM2-135M are in docs/megatron.md):

    torchrun --standalone --nproc_per_node 3 -m nemo_azr.models.megatron.parity logits /tmp/smol --tp 3
    torchrun --standalone --nproc_per_node 2 -m nemo_azr.models.megatron.parity logits /tmp/smol --pp 2
    python -m nemo_azr.models.megatron.parity generate /tmp/smol /tmp/smol_hf --prompt "What is 17 + 25?"
    python -m nemo_azr.models.megatron.parity steps RUN_HF RUN_MEGATRON --source /tmp/smol

``logits`` builds the megatron model at the layout from the HF folder and prints one JSON line
(rank 0) comparing it with transformers: the full logits of a batch of random tokens (the TP shards
all-gathered, through megatron's pipeline schedule with pp > 1, megatron's padded vocabulary rows
cut off), the token log-probs of a left/right-padded batch (the training path), and whether the
HF state dict gathered back from the shards equals the safetensors bit for bit. As the float32 noise
floor, it also gives both models' logit distance to transformers run in float64.
``generate`` decodes a chat prompt (each folder's own chat template and tokenizer) greedily with
plain transformers from both folders and prints both texts, whether the tokens are equal and
whether the weights are (bit for bit); exit status 1 when the tokens differ.
``steps`` compares the first step of two ``nemo-azr train`` runs: rewards, tokens, loss, grad norm
and the ``step_1`` HF exports' weights.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "compare_steps",
    "greedy_chat_tokens",
    "hf_token_logprobs",
    "megatron_logits",
    "parity_report",
    "weights_equal",
]


@torch.no_grad()
def megatron_logits(model: torch.nn.Module | list[torch.nn.Module], input_ids: torch.Tensor) -> torch.Tensor:
    """Full logits ``[B, S, V]`` (float32, real vocabulary only) of unpadded rows, on every rank.

    Collective over the tensor- and pipeline-parallel group: every rank calls it with the same ids.
    With pp > 1 the rows go through megatron's forward-only schedule as one micro-batch and the
    last stage's logits are broadcast. Virtual pipeline chunks are not supported.
    """
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if len(chunks) != 1:
        raise ValueError("megatron_logits: virtual pipeline chunks are not supported")
    stage = chunks[0]
    while hasattr(stage, "module"):  # DDP / Float16Module wrappers
        stage = stage.module
    was_training = stage.training
    stage.eval()
    device = next(stage.parameters()).device
    b, s = input_ids.shape
    ids = input_ids.to(device)
    positions = torch.arange(s, device=device).expand(b, s)
    tp = ps.get_tensor_model_parallel_world_size()
    local_vocab = stage.padded_vocab_size // tp
    if ps.get_pipeline_model_parallel_world_size() == 1:
        local = stage(ids, positions, None)
    else:
        kept: list[torch.Tensor] = []

        def forward_step(data_iterator, chunk):
            next(data_iterator)
            output = chunk(ids, positions, None)

            def loss_func(logits: torch.Tensor):
                kept.append(logits)
                return logits.new_zeros(()), torch.ones((), dtype=torch.int), {}

            return output, loss_func

        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter([None]),
            model=[stage],
            num_microbatches=1,
            seq_length=s,
            micro_batch_size=b,
            forward_only=True,
        )
        local = kept[0] if kept else torch.empty(b, s, local_vocab, dtype=torch.float32, device=device)
        local = local.float().contiguous()
        dist.broadcast(
            local,
            src=ps.get_pipeline_model_parallel_last_rank(),
            group=ps.get_pipeline_model_parallel_group(),
        )
    local = local.float().contiguous()
    if tp > 1:
        parts = [torch.empty_like(local) for _ in range(tp)]
        dist.all_gather(parts, local, group=ps.get_tensor_model_parallel_group())
        local = torch.cat(parts, dim=-1)
    stage.train(was_training)
    return local[..., : stage.real_vocab_size].cpu()


def hf_token_logprobs(hf_model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Column t = log p(token t | real tokens < t) under a transformers model; 0 where t or t-1 is padding."""
    ids, attn = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logits = hf_model(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"]).logits
    lp = logits[:, :-1].float().log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp * ((attn[:, 1:] > 0) & (attn[:, :-1] > 0)), (1, 0))


def _batches(vocab: int, seed: int, seq_len: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Random unpadded ids ``[2, seq_len]`` and a padded prompt/response batch (same on every rank)."""
    from nemo_azr.contracts.assemble import pack_prompt_response

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, seq_len), generator=g)
    half = max(seq_len // 2, 2)
    prompts = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (half, 3, half - 1, 1)]
    responses = [torch.randint(1, vocab, (n,), generator=g).tolist() for n in (half, half, 2, 0)]
    return ids, pack_prompt_response(prompts, responses, None, pad_id=0)


def parity_report(
    hf_dir: str | Path, *, tp: int = 1, pp: int = 1, seed: int = 0, seq_len: int = 32
) -> dict[str, Any] | None:
    """Build and load the megatron model at ``tp`` x ``pp`` (data parallel over the rest) and compare
    it with transformers on global rank 0 (returns the report there, None elsewhere). Collective."""
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from nemo_azr.distributed.parallel import ParallelLayout, destroy_parallel, initialize_parallel
    from nemo_azr.models.megatron.builder import build_gpt_model
    from nemo_azr.models.megatron.hf_adapter import gather_hf_state_dict, load_hf_into_megatron
    from nemo_azr.models.megatron.logprobs import megatron_token_logprobs

    hf_dir = Path(hf_dir)
    layout = ParallelLayout(tp=tp, pp=pp)
    start = time.perf_counter()
    initialize_parallel(layout, seed=seed)
    hf_config = AutoConfig.from_pretrained(str(hf_dir))
    model = build_gpt_model(hf_config, layout)
    load_hf_into_megatron(model, hf_dir, layout)
    loaded = time.perf_counter()
    ids, batch = _batches(hf_config.vocab_size, seed, seq_len)
    logits = megatron_logits(model, ids)
    with torch.no_grad():
        lp = megatron_token_logprobs(
            model, batch["input_ids"], batch["attention_mask"], batch["position_ids"], micro_batch_size=2
        )
    forward = time.perf_counter()
    gathered = gather_hf_state_dict(model, hf_config, layout)
    ranks = {
        "world": dist.get_world_size(),
        "tp": tp,
        "pp": pp,
        "padded_vocab": model.padded_vocab_size,
        "real_vocab": model.real_vocab_size,
    }
    is_rank0 = dist.get_rank() == 0
    dist.barrier()
    destroy_parallel()
    if not is_rank0:
        return None
    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        want_logits = hf(input_ids=ids).logits.float()
        # The float32 noise floor: both float32 models against transformers in float64.
        exact_logits = hf.to(torch.float64)(input_ids=ids).logits
    want_lp = hf_token_logprobs(hf.to(torch.float32), batch)
    files = sorted(hf_dir.glob("*.safetensors"))
    want_sd: dict[str, torch.Tensor] = {}
    for f in files:
        want_sd.update(load_file(str(f)))
    if getattr(hf_config, "tie_word_embeddings", False):
        want_sd.pop("lm_head.weight", None)
    exact = gathered is not None and gathered.keys() == want_sd.keys()
    exact = exact and all(torch.equal(gathered[k], want_sd[k]) for k in want_sd)
    return {
        "model": str(hf_dir),
        **ranks,
        "logits_shape": list(logits.shape),
        "max_abs_logit_diff": float((logits - want_logits).abs().max()),
        "max_abs_logit": float(want_logits.abs().max()),
        "max_abs_logprob_diff": float((lp - want_lp).abs().max()),
        "logprob_tokens": int((want_lp != 0).sum()),
        "argmax_equal": bool(torch.equal(logits.argmax(-1), want_logits.argmax(-1))),
        "hf_fp32_vs_fp64_max_abs_logit_diff": float((want_logits - exact_logits).abs().max()),
        "megatron_vs_fp64_max_abs_logit_diff": float((logits - exact_logits).abs().max()),
        "round_trip_exact": bool(exact),
        "tensors": len(want_sd),
        "build_load_s": round(loaded - start, 2),
        "forward_s": round(forward - loaded, 2),
        "total_s": round(time.perf_counter() - start, 2),
    }


def greedy_chat_tokens(folder: str | Path, prompt: str, max_new_tokens: int = 32) -> tuple[list[int], str]:
    """Greedy continuation (token ids, decoded text) of one user turn under the folder's chat
    template, with plain transformers (float32, CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=pad)
    new = out[0, enc["input_ids"].shape[1] :].tolist()
    return new, tokenizer.decode(new, skip_special_tokens=True)


def _safetensors(folder: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def weights_equal(folder_a: str | Path, folder_b: str | Path) -> bool:
    """Whether two HF folders hold the same tensors (names, dtypes and values, bit for bit)."""
    a, b = _safetensors(folder_a), _safetensors(folder_b)
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def compare_steps(run_a: str | Path, run_b: str | Path, source: str | Path) -> dict[str, Any]:
    """First-step metrics and ``step_1`` weights of two training runs of the same model (e.g. ``hf``
    vs ``megatron`` at some layout), and how far the step moved the weights from ``source``."""
    metrics = [json.loads((Path(r) / "metrics.jsonl").read_text().splitlines()[0]) for r in (run_a, run_b)]
    wa, wb = (_safetensors(Path(r) / "checkpoints" / "step_1" / "model") for r in (run_a, run_b))
    src = _safetensors(source)
    diff = {k: (wa[k] - wb[k]).abs() for k in wa}
    worst = max(diff, key=lambda k: float(diff[k].max()))
    out: dict[str, Any] = {
        k: [m[k] for m in metrics] for k in ("reward/mean", "batch/tokens", "actor/loss", "actor/grad_norm")
    }
    a_norm, b_norm = out["actor/grad_norm"]
    out.update(
        {
            "grad_norm_rel_diff": abs(a_norm - b_norm) / a_norm,
            "max_abs_weight_diff": float(diff[worst].max()),
            "worst_tensor": worst,
            "weights_diff_over_1e-5": sum(int((d > 1e-5).sum()) for d in diff.values()),
            "weights": sum(d.numel() for d in diff.values()),
            "max_abs_update": max(float((wa[k] - src[k]).abs().max()) for k in wa),
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    import warnings

    parser = argparse.ArgumentParser(prog="python -m nemo_azr.models.megatron.parity", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    lg = sub.add_parser("logits", help="megatron vs transformers logits / log-probs / round trip (torchrun)")
    lg.add_argument("hf_dir")
    lg.add_argument("--tp", type=int, default=1)
    lg.add_argument("--pp", type=int, default=1)
    lg.add_argument("--seed", type=int, default=0)
    lg.add_argument("--seq-len", type=int, default=32)
    gen = sub.add_parser("generate", help="weights and greedy chat text of two HF folders (transformers)")
    gen.add_argument("reference")
    gen.add_argument("other")
    gen.add_argument("--prompt", default="What is 17 + 25?")
    gen.add_argument("--max-new-tokens", type=int, default=32)
    steps = sub.add_parser("steps", help="first-step metrics and step_1 weights of two training runs")
    steps.add_argument("run_a")
    steps.add_argument("run_b")
    steps.add_argument("--source", required=True, help="the HF folder both runs started from")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    if args.command == "logits":
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if local_world > 1:  # processes share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
        report = parity_report(args.hf_dir, tp=args.tp, pp=args.pp, seed=args.seed, seq_len=args.seq_len)
        if report is not None:
            print(json.dumps(report))
        return 0
    if args.command == "steps":
        print(json.dumps(compare_steps(args.run_a, args.run_b, args.source)))
        return 0
    start = time.perf_counter()
    want, want_text = greedy_chat_tokens(args.reference, args.prompt, args.max_new_tokens)
    got, got_text = greedy_chat_tokens(args.other, args.prompt, args.max_new_tokens)
    report = {
        "prompt": args.prompt,
        "reference_text": want_text,
        "other_text": got_text,
        "tokens_equal": want == got,
        "new_tokens": len(want),
        "weights_equal": weights_equal(args.reference, args.other),
        "wall_s": round(time.perf_counter() - start, 2),
    }
    print(json.dumps(report))
    return 0 if want == got else 1


if __name__ == "__main__":
    raise SystemExit(main())
