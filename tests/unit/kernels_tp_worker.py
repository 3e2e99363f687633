"""One rank of the vocab-parallel kernel check (run by test_kernels_tp.py, two processes over gloo).

Every rank builds the same data, runs each kernel on its vocab shard over a tensor-parallel group
(a subgroup, as megatron-core's TP group is) and on the whole vocabulary without a group (TP=1),
and prints the largest relative differences as one JSON line.

    python kernels_tp_worker.py RANK WORLD STORE_FILE BACKEND[,BACKEND...]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.kernels import fused_linear_policy_loss, linear_token_logprobs, token_logprobs
from nemo_azr.kernels.vocab_parallel import vocab_shard, vocab_shard_range

N, H, V, T = 12, 16, 32000, 0.8


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def data():
    g = torch.Generator().manual_seed(1234)
    hidden = torch.randn(N, H, generator=g)
    weight = torch.randn(V, H, generator=g) * 0.4
    targets = torch.randint(0, V, (N,), generator=g)
    targets[3] = -100
    coef = torch.randn(N, generator=g)
    coef_e = torch.randn(N, generator=g)
    return hidden, weight, targets, coef, coef_e


def run_logits(backend, group, out):
    hidden, weight, targets, coef, coef_e = data()
    logits = hidden @ weight.t()
    start, end = vocab_shard_range(V, group)
    results = []
    for grp, x_full in ((group, vocab_shard(logits, group, dim=1)), (None, logits)):
        x = x_full.clone().requires_grad_(True)
        lp, ent = token_logprobs(x, targets, T, backend=backend, return_entropy=True, process_group=grp)
        (lp * coef + ent * coef_e).sum().backward()
        results.append((lp, ent, x.grad))
    (lp, ent, gx), (lp1, ent1, gx1) = results
    out["logits/logp"] = rel(lp, lp1)
    out["logits/entropy"] = rel(ent, ent1)
    out["logits/grad"] = rel(gx, gx1[:, start:end])


def run_linear(backend, group, out):
    hidden, weight, targets, coef, coef_e = data()
    start, end = vocab_shard_range(V, group)
    results = []
    for grp, w_full in ((group, weight[start:end]), (None, weight)):
        h, w = hidden.clone().requires_grad_(True), w_full.clone().requires_grad_(True)
        lp, ent = linear_token_logprobs(
            h, w, targets, T, backend=backend, chunk_size=8, return_entropy=True, process_group=grp
        )
        (lp * coef + ent * coef_e).sum().backward()
        results.append((lp, ent, h.grad, w.grad))
    (lp, ent, gh, gw), (lp1, ent1, gh1, gw1) = results
    out["linear/logp"] = rel(lp, lp1)
    out["linear/entropy"] = rel(ent, ent1)
    out["linear/grad_hidden"] = rel(gh, gh1)
    out["linear/grad_weight"] = rel(gw, gw1[start:end])


def run_fused(backend, group, out):
    hidden, weight, targets, coef, _ = data()
    b, t = 3, N // 3
    g = torch.Generator().manual_seed(99)
    mask = (torch.rand(b, t, generator=g) < 0.8).float()
    adv = torch.randn(b, 1, generator=g).expand(b, t) * mask
    with torch.no_grad():
        lp0 = linear_token_logprobs(hidden, weight, targets.clamp(min=0), T).view(b, t)
    old = (lp0 + 0.5 * torch.randn(b, t, generator=g)) * mask
    ref = (lp0 + 0.3 * torch.randn(b, t, generator=g)) * mask
    cfg = AlgorithmConfig(loss_agg_mode="seq-mean-token-mean", entropy_coef=0.01, clip_ratio_c=1.5)
    cfg.kl.coef = 0.05
    start, end = vocab_shard_range(V, group)
    results = []
    for grp, w_full in ((group, weight[start:end]), (None, weight)):
        h, w = hidden.clone().view(b, t, H).requires_grad_(True), w_full.clone().requires_grad_(True)
        loss, metrics = fused_linear_policy_loss(
            h,
            w,
            targets.clamp(min=0).view(b, t),
            advantages=adv,
            loss_mask=mask,
            cfg=cfg,
            old_logprobs=old,
            ref_logprobs=ref,
            temperature=T,
            backend=backend,
            chunk_size=5,
            process_group=grp,
        )
        loss.backward()
        results.append((loss, metrics, h.grad, w.grad))
    (loss, m, gh, gw), (loss1, m1, gh1, gw1) = results
    out["fused/loss"] = abs(float(loss.detach()) - float(loss1.detach())) / max(
        1.0, abs(float(loss1.detach()))
    )
    out["fused/metrics"] = max(abs(m[k] - m1[k]) / max(1.0, abs(m1[k])) for k in m1)
    out["fused/metric_keys_equal"] = float(m.keys() == m1.keys())
    out["fused/grad_hidden"] = rel(gh, gh1)
    out["fused/grad_weight"] = rel(gw, gw1[start:end])


def main() -> None:
    rank, world, store_file, backends = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    store = dist.FileStore(store_file, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    tp_group = dist.new_group(ranks=list(range(world)))  # a subgroup, like megatron-core's TP group
    report = {}
    for backend in backends.split(","):
        out: dict[str, float] = {}
        run_logits(backend, tp_group, out)
        run_linear(backend, tp_group, out)
        run_fused(backend, tp_group, out)
        report[backend] = out
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": rank, "report": report}))


if __name__ == "__main__":
    main()
