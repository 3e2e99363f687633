"""Ranks of the megatron reward-model check (run by test_megatron_reward_model.py under torchrun over gloo).

For each named variant of the spec (overrides: the layout) every rank runs ``nemo-azr train-rm`` with
``model.backend=megatron``; rank 0 writes the model and its ``metrics.jsonl`` into ``OUT/<name>``.

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_reward_model_worker.py OUT SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist


def main(out_dir: str, spec_file: str) -> None:
    from nemo_azr.cli import main as cli

    spec = json.loads(Path(spec_file).read_text())
    for name, extra in spec["variants"].items():
        out = Path(out_dir) / name
        status = cli(
            ["train-rm", "model.backend=megatron", *spec["overrides"], *extra, f"trainer.output_dir={out}"]
        )
        assert status == 0, (name, status)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
