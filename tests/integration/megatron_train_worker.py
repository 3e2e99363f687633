"""One rank of the megatron training check (run by test_megatron_train.py under torchrun over gloo).

Every rank builds the same Trainer (``model.backend=megatron`` plus the given overrides) and runs
``fit``; ranks share ``trainer.output_dir`` and only rank 0 writes metrics and publishes checkpoints.
Rank 0 also writes OUT_DIR/result.json with the fit status and step.

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_train_worker.py OUT_DIR OVERRIDE...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist


def main(out_dir: str, overrides: list[str]) -> None:
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.trainer import Trainer

    cfg = load_config(["model.backend=megatron", *overrides])
    result = Trainer(cfg).fit()
    if dist.get_rank() == 0:
        report = {"status": result.status, "step": result.step, "world": dist.get_world_size()}
        (Path(out_dir) / "result.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
