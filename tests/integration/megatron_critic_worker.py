"""One rank of the megatron critic check (run by test_megatron_critic.py under torchrun over gloo).

For each named variant of the spec (a list of overrides: the layout and more) every rank builds the
same PPO Trainer (``model.backend=megatron``, ``algorithm=ppo``) and runs ``steps`` train steps;
rank 0 writes their metrics to ``OUT/steps_<name>.json`` and the critic's values on a fixed batch to
``OUT/values_<name>.pt``. The first variant's trainer also saves a checkpoint, which the ``reshard``
overrides load (``OUT/values_resharded.pt``).

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_critic_worker.py OUT SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def _trainer(spec: dict, extra: list[str], out: Path):
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.trainer import Trainer

    cfg = load_config(["model.backend=megatron", *spec["overrides"], *extra, f"trainer.output_dir={out}"])
    return Trainer(cfg)


def _values(trainer, batch_file: str) -> torch.Tensor:
    from nemo_azr.contracts import Batch

    return trainer.critic.compute_values(Batch(torch.load(batch_file)))


def main(out_dir: str, spec_file: str) -> None:
    out = Path(out_dir)
    spec = json.loads(Path(spec_file).read_text())
    saved = None
    for name, extra in spec["variants"].items():
        trainer = _trainer(spec, extra, out / name)
        trainer.setup_generation()
        metrics = [trainer.train_step(step) for step in range(spec["steps"])]
        trainer.state.step = spec["steps"]
        values = _values(trainer, spec["batch_file"])
        if dist.get_rank() == 0:
            (out / f"steps_{name}.json").write_text(json.dumps(metrics))
            torch.save(values, out / f"values_{name}.pt")
        if saved is None:
            saved = trainer.save_checkpoint()
    reshard = _trainer(spec, spec["reshard"], out / "reshard")
    reshard.load_checkpoint(Path(str(saved)))
    values = _values(reshard, spec["batch_file"])
    if dist.get_rank() == 0:
        torch.save(values, out / "values_resharded.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
