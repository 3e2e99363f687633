#!/usr/bin/env python
"""DPO, IPO and KTO: nemo_azr's losses against TRL's trainers on the same tensors (seed 004, class 5).

TRL computes these losses inside ``DPOTrainer._compute_loss`` / ``KTOTrainer._compute_loss``, from
the per-token log-probs its model forward returns. This script calls those methods unbound with a
stand-in trainer (the attributes the loss reads: beta, loss type, weights, a pass-through
accelerator) and a stand-in model that returns fixed per-token log-probs, so both sides see the
same numbers with no model and no tokenizer in between. It compares the loss and its gradient with
respect to the per-token log-probs for random batches of uneven lengths:

- DPO (TRL ``loss_type="sigmoid"``) against ``nemo_azr.algorithms.preference.dpo_loss`` on the
  summed log-probs;
- IPO (TRL ``loss_type="ipo"``) against ``ipo_loss``. TRL divides each response's log-ratio by its
  token count before the squared loss (its comment says the IPO authors confirmed this form), while
  ``ipo_loss`` reads whole-sequence log-probs as the paper writes them (decision in docs/decisions.md).
  The comparison feeds ``ipo_loss`` the per-token means, which is the same function;
- KTO (TRL ``loss_type="kto"``, reference point from the mismatched-pair KL, clamped at 0) against
  ``kto_loss``.

Needs TRL (the benchmark venv, benchmarks/README.md). Writes ``benchmarks/results/preference_vs_trl.{json,md}``:

    .venv-bench/bin/python benchmarks/preference_vs_trl.py
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nemo_azr.algorithms.preference import dpo_loss, ipo_loss, kto_loss  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TOLERANCE = 1e-5  # float64 on both sides; what is left is summation order


class _PassThrough:
    """The accelerator calls the losses make, on one process."""

    device = torch.device("cpu")

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        return t

    gather_for_metrics = gather


class _FixedModel:
    """Returns the given per-token log-probs for whichever ``input_ids`` it is called with."""

    training = True

    def __init__(self, by_input: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.by_input = by_input

    def __call__(self, *, input_ids: torch.Tensor, **_: object) -> SimpleNamespace:
        log_probs = next(lp for ids, lp in self.by_input if ids is input_ids)
        zeros = torch.zeros_like(log_probs)
        return SimpleNamespace(log_probs=log_probs, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())


def _trainer_stub(model: _FixedModel, **attrs: object) -> SimpleNamespace:
    base = {
        "model": model,
        "accelerator": _PassThrough(),
        "aux_loss_enabled": False,
        "precompute_ref_logps": True,
        "_metrics": defaultdict(lambda: defaultdict(list)),
        "_total_train_tokens": 0,
        "_tp_size": 1,
    }
    return SimpleNamespace(**base, **attrs)


def _batch(rows: int, length: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token log-probs [rows, length], their completion mask); lengths 1..length, zeros past them."""
    lengths = torch.randint(1, length + 1, (rows,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).double()
    logps = -torch.rand(rows, length, generator=gen, dtype=torch.float64) * 3 * mask
    return logps, mask


def _inputs(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """TRL's batch layout: one prompt token, then the completion (its mask is shifted by one)."""
    rows = mask.shape[0]
    completion = torch.cat([torch.zeros(rows, 1, dtype=torch.long), mask.long()], dim=1)
    return {
        "input_ids": torch.ones_like(completion),
        "attention_mask": torch.ones_like(completion),
        "completion_mask": completion,
    }


def compare_paired(loss_type: str, pairs: int, length: int, beta: float, seed: int) -> dict:
    from trl import DPOTrainer

    gen = torch.Generator().manual_seed(seed)
    logps, mask = _batch(2 * pairs, length, gen)  # [chosen; rejected], TRL's order
    ref = -torch.rand(2 * pairs, generator=gen, dtype=torch.float64) * 3 * mask.sum(1)
    inputs = _inputs(mask) | {"ref_chosen_logps": ref[:pairs], "ref_rejected_logps": ref[pairs:]}

    theirs_in = logps.clone().requires_grad_(True)
    stub = _trainer_stub(
        _FixedModel([(inputs["input_ids"], theirs_in)]),
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        loss_types=[{"dpo": "sigmoid", "ipo": "ipo"}[loss_type]],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
    )
    theirs = DPOTrainer._compute_loss(stub, stub.model, inputs, False)
    theirs.backward()

    ours_in = logps.clone().requires_grad_(True)
    seq, ref_seq = ours_in.sum(1), ref
    if loss_type == "ipo":  # TRL's per-token normalisation, applied to both log-probs of the ratio
        count = mask.sum(1).clamp(min=1.0)
        seq, ref_seq = seq / count, ref / count
    fn = dpo_loss if loss_type == "dpo" else ipo_loss
    ours, _ = fn(seq[:pairs], seq[pairs:], ref_seq[:pairs], ref_seq[pairs:], beta=beta)
    ours.backward()
    return _row(loss_type, pairs, beta, ours, theirs, ours_in.grad, theirs_in.grad)


def compare_kto(examples: int, length: int, beta: float, seed: int, weights: tuple[float, float]) -> dict:
    from trl import KTOTrainer

    gen = torch.Generator().manual_seed(seed)
    logps, mask = _batch(examples, length, gen)
    kl_logps, kl_mask = _batch(examples, length, gen)
    ref = -torch.rand(examples, generator=gen, dtype=torch.float64) * 3 * mask.sum(1)
    # the mismatched pairs' reference a little below the policy, so the reference point is above 0
    ref_kl = kl_logps.sum(1) - torch.rand(examples, generator=gen, dtype=torch.float64)
    desirable = torch.arange(examples) % 3 != 0  # two desirable for one undesirable
    main, kl = _inputs(mask), _inputs(kl_mask)
    inputs = main | {
        "label": desirable,
        "KL_input_ids": kl["input_ids"],
        "KL_attention_mask": kl["attention_mask"],
        "KL_completion_mask": kl["completion_mask"],
        "ref_logps": ref,
        "ref_KL_logps": ref_kl,
    }

    theirs_in = logps.clone().requires_grad_(True)
    stub = _trainer_stub(
        _FixedModel([(inputs["input_ids"], theirs_in), (inputs["KL_input_ids"], kl_logps)]),
        calculate_KL=True,
        loss_type="kto",
        beta=beta,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
    )
    stub._compute_kl_logps = lambda model, batch: KTOTrainer._compute_kl_logps(stub, model, batch)
    theirs = KTOTrainer._compute_loss(stub, stub.model, inputs, False)
    theirs.backward()

    ours_in = logps.clone().requires_grad_(True)
    ours, _ = kto_loss(
        ours_in.sum(1),
        ref,
        desirable,
        kl_logps.sum(1),
        ref_kl,
        beta=beta,
        desirable_weight=weights[0],
        undesirable_weight=weights[1],
    )
    ours.backward()
    return _row("kto", examples, beta, ours, theirs, ours_in.grad, theirs_in.grad) | {
        "weights": list(weights)
    }


def _row(name: str, n: int, beta: float, ours, theirs, grad_ours, grad_theirs) -> dict:
    ours, theirs = float(ours.detach()), float(theirs.detach())
    loss_diff = abs(ours - theirs)
    grad_diff = float((grad_ours - grad_theirs).abs().max())
    return {
        "loss": name,
        "n": n,
        "beta": beta,
        "ours": ours,
        "trl": theirs,
        "loss_abs_diff": loss_diff,
        "grad_max_abs_diff": grad_diff,
        "grad_norm": float(grad_ours.norm()),
        "equal": loss_diff <= TOLERANCE and grad_diff <= TOLERANCE,
    }


def main() -> None:
    import trl

    rows = []
    for seed, beta in ((0, 0.1), (1, 0.5)):
        rows.append(compare_paired("dpo", 8, 12, beta, seed))
        rows.append(compare_paired("ipo", 8, 12, beta, seed))
        rows.append(compare_kto(9, 12, beta, seed, (1.0, 1.33) if seed else (1.0, 1.0)))
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out = {
        "date": date,
        "trl": trl.__version__,
        "torch": torch.__version__,
        "tolerance": TOLERANCE,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "preference_vs_trl.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        "# DPO, IPO and KTO: nemo_azr against TRL on the same tensors",
        "",
        f"Measured {date}, TRL {trl.__version__}, torch {torch.__version__}, float64 "
        "(`benchmarks/preference_vs_trl.py`: TRL's `DPOTrainer` / `KTOTrainer` loss code called with "
        "fixed per-token log-probs; gradients with respect to those log-probs). IPO: TRL divides each "
        "log-ratio by the response's token count, so `ipo_loss` is fed per-token means here.",
        "",
        "| loss | pairs / examples | beta | nemo_azr | TRL | loss difference | largest gradient difference | equal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['loss']} | {r['n']} | {r['beta']} | {r['ours']:.6f} | {r['trl']:.6f} | "
            f"{r['loss_abs_diff']:.1e} | {r['grad_max_abs_diff']:.1e} | {'yes' if r['equal'] else 'NO'} |"
        )
    (RESULTS / "preference_vs_trl.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not all(r["equal"] for r in rows):
        raise SystemExit("a loss differs from TRL's beyond the tolerance")


if __name__ == "__main__":
    main()
