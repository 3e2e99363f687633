"""Ranks of the megatron preference check (run by test_megatron_preference.py under torchrun over gloo).

For each named variant of the spec (overrides: the layout) every rank builds the same Trainer
(``model.backend=megatron``, the variant's layout and preference loss) and runs ``fit``; rank 0 writes the run's
``metrics.jsonl`` into ``OUT/<name>`` as any run does.

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_preference_worker.py OUT SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist


def main(out_dir: str, spec_file: str) -> None:
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.trainer import Trainer

    spec = json.loads(Path(spec_file).read_text())
    for name, extra in spec["variants"].items():
        out = Path(out_dir) / name
        cfg = load_config(["model.backend=megatron", *spec["overrides"], *extra, f"trainer.output_dir={out}"])
        Trainer(cfg).fit()
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
