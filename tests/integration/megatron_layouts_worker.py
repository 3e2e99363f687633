"""One rank of the megatron layout checks (run by test_megatron_train.py and test_megatron_gqa.py under
torchrun over gloo: 2 processes, or 3 for tensor parallel 3).

Scenarios, in one launch (megatron's groups are re-created for each layout); each runs only when
its key is in the spec:

1. ``step``: one GRPO step from the warm model for each entry of ``steps`` (name -> overrides: data
   parallel 2, pipeline parallel 2, each also with the distributed optimizer); rank 0 saves the step's
   metrics and the gathered HF weights. For the steps named in ``parity``, rank 0 first saves the
   loaded model's log-probs of the fixed batch, full logits of ``logits_ids_file``'s rows (TP shards
   gathered) and gathered HF weights (``parity_<name>.pt``).
2. ``run_a``: 4 steps at ``tp2pp1`` with a checkpoint every 2 steps (``run_a_extra``: written in the
   background, ``trainer.async_save``); ``run_b``: the same run resumed from run A's ``step_2``.
3. ``run_c``: 2 steps at data parallel 2 with the distributed optimizer, a checkpoint every step;
   ``run_d``: the same run resumed from run C's ``step_1`` at ``tp2pp1`` (data parallel 1).
4. ``run_e`` / ``run_f``: 2 steps at ``tp2pp1`` / ``tp1pp2`` generating with
   ``generation.backend=megatron``; after run E each rank saves its greedy replies by the static
   decode path and by megatron-core's loop (``static_decode_tp2_rank<r>.pt``).
5. ``reshard``: run A's ``step_4`` checkpoint loaded at ``tp1pp1`` (dp 2), ``tp1pp2`` and ``tp2pp1``;
   rank 0 saves the log-probs of a fixed batch.
6. ``convert``: ``nemo-azr convert`` argument lists, run in order on every rank (the CLI's code path
   under torchrun).

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_layouts_worker.py OUT SPEC.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _trainer(spec: dict, *extra: str):
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.trainer import Trainer

    return Trainer(load_config([*spec["overrides"], *extra]))


def _save(obj, path: Path) -> None:
    if dist.get_rank() == 0:
        torch.save(obj, path)


def _parity(policy, batch, logits_ids_file: str) -> dict:
    """The loaded model's log-probs of ``batch``, full logits of the saved ids, gathered HF weights."""
    from nemo_azr.models.megatron.parity import megatron_logits

    return {
        "logprobs": policy.compute_logprobs(batch),
        "logits": megatron_logits(policy.chunks, torch.load(logits_ids_file)),
        "weights": policy.export_hf_state_dict(),
    }


def _static_and_dynamic_greedy(trainer) -> dict[str, list[list[int]]]:
    """Greedy replies of prompts of different lengths from the trained policy's shards, decoded by
    the static path (rollout/megatron_static_decode.py) and by megatron-core's loop (both collective)."""
    from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
    from nemo_azr.rollout.megatron_backend import MegatronGenerationBackend
    from nemo_azr.rollout.single_turn import encode_prompt

    tok = trainer.tokenizer
    requests = [
        GenerationRequest(encode_prompt(tok, [{"role": "user", "content": q}]))
        for q in ("What is 1 + 2?", "Hi", "What is 17 + 28? Say it.")
    ]
    sp = SamplingParams(n=1, greedy=True, max_new_tokens=12)
    return {
        decode: [
            o.samples[0].token_ids
            for o in MegatronGenerationBackend(trainer.policy, tok, decode=decode).generate(requests, sp)
        ]
        for decode in ("static", "dynamic")
    }


def main(out: str, spec_file: str) -> None:
    from nemo_azr.contracts import Batch

    out_dir = Path(out)
    spec = json.loads(Path(spec_file).read_text())
    batch = Batch(tensors=torch.load(spec["batch_file"])) if "batch_file" in spec else None
    for name, extra in spec.get("steps", {}).items():
        trainer = _trainer(spec, *extra, f"trainer.output_dir={out_dir / ('step_' + name)}")
        if name in spec.get("parity", []):
            _save(_parity(trainer.policy, batch, spec["logits_ids_file"]), out_dir / f"parity_{name}.pt")
        trainer.setup_generation()
        metrics = trainer.train_step(0)
        _save(
            {"metrics": metrics, "weights": trainer.policy.export_hf_state_dict()},
            out_dir / f"step_{name}.pt",
        )

    if "run" in spec:
        run_a = out_dir / "run_a"
        _trainer(
            spec, "parallel=tp2pp1", f"trainer.output_dir={run_a}", *spec["run"], *spec["run_a_extra"]
        ).fit()
        _trainer(
            spec,
            "parallel=tp2pp1",
            f"trainer.output_dir={out_dir / 'run_b'}",
            f"trainer.resume={run_a / 'checkpoints' / 'step_2'}",
            *spec["run"],
        ).fit()

    if "run_c" in spec:
        run_c = out_dir / "run_c"
        distopt = "parallel.distributed_optimizer=true"
        _trainer(spec, "parallel=tp1pp1", distopt, f"trainer.output_dir={run_c}", *spec["run_c"]).fit()
        _trainer(
            spec,
            "parallel=tp2pp1",
            distopt,
            f"trainer.output_dir={out_dir / 'run_d'}",
            f"trainer.resume={run_c / 'checkpoints' / 'step_1'}",
            *spec["run_c"],
        ).fit()

    if "run_e" in spec:
        # generation.backend=megatron at TP=2 and PP=2: the ranks decode with megatron's inference path.
        for name, layout in (("run_e", "tp2pp1"), ("run_f", "tp1pp2")):
            trainer = _trainer(
                spec,
                f"parallel={layout}",
                "generation.backend=megatron",
                f"trainer.output_dir={out_dir / name}",
                *spec["run_e"],
            )
            trainer.fit()
            if name == "run_e":  # each rank's greedy replies, static path and megatron-core's loop
                rank = dist.get_rank()
                torch.save(_static_and_dynamic_greedy(trainer), out_dir / f"static_decode_tp2_rank{rank}.pt")

    for layout in spec.get("reshard_layouts", []):
        trainer = _trainer(
            spec, f"parallel={layout}", f"trainer.output_dir={out_dir / ('reshard_' + layout)}"
        )
        trainer.load_checkpoint(out_dir / "run_a" / "checkpoints" / "step_4")
        _save(trainer.policy.compute_logprobs(batch), out_dir / f"reshard_{layout}.pt")

    from nemo_azr.cli import main as cli_main

    for args in spec.get("convert", []):
        assert cli_main(args) == 0, args  # collective; the folder is complete on return

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
