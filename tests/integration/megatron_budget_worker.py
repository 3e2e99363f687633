"""One rank of the megatron token-budget checks (run by test_megatron_token_budget.py under torchrun
over gloo, 2 processes; the test also calls :func:`run_variant` itself on one process).

For each variant of the spec (name -> overrides: the layout and ``algorithm.max_tokens_per_microbatch``)
every rank builds a ``MegatronPolicy`` and a ``MegatronCritic`` from the same HF folder (the spec's
``model_path``, or ``models[name]`` where given) and runs, on the spec's fixed batch: the no-grad
log-probs, a policy update, the critic's values, a critic update and its values after. Rank 0 writes
the results to ``OUT/<name>.pt``; every rank writes the ``[rows, columns]`` of each micro-batch its
first model chunk ran in the policy update (the interleaved schedule's filler micro-batches
included) to ``OUT/<name>_shapes<rank>.json``.

    python -m torch.distributed.run --standalone --nproc_per_node 2 megatron_budget_worker.py OUT SPEC
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist


def run_variant(
    model_path: str, overrides: list[str], tensors: dict[str, torch.Tensor], *, is_in_loss: bool = False
) -> dict:
    """The variant's results (identical on every rank) and the micro-batch shapes of the update.

    With ``algorithm.off_policy_correction`` in ``overrides`` the rollout policy's log-probs are the
    no-grad ones minus the noise, and either the loss computes the importance weights from its own
    log-probs (``is_in_loss``: no old log-probs in the batch) or they weigh the advantages first,
    with the no-grad log-probs as the old ones (the explicit path)."""
    from nemo_azr.algorithms.off_policy import rollout_is_weights
    from nemo_azr.contracts import Batch
    from nemo_azr.contracts import fields as F
    from nemo_azr.contracts.update import UpdateContext
    from nemo_azr.models.megatron.critic import MegatronCritic
    from nemo_azr.models.megatron.policy import MegatronPolicy
    from nemo_azr.preflight import load_config

    cfg = load_config(overrides)
    policy = MegatronPolicy(model_path, cfg)
    critic = MegatronCritic(model_path, cfg)
    policy.setup_optimizer(total_steps=4)
    critic.setup_optimizer(total_steps=4)
    batch = Batch({k: v for k, v in tensors.items() if k != "old_noise"})
    norm_length = batch.seq_len
    logprobs = policy.compute_logprobs(batch)
    noise = tensors["old_noise"] * batch[F.LOSS_MASK]
    alg = cfg.algorithm
    if alg.off_policy_correction == "none":
        batch.tensors[F.OLD_LOGPROBS] = logprobs + noise
    elif is_in_loss:
        batch.tensors[F.ROLLOUT_LOGPROBS] = logprobs - noise
    else:
        weights, _ = rollout_is_weights(
            logprobs, logprobs - noise, batch[F.LOSS_MASK], mode=alg.off_policy_correction, cap=alg.is_cap
        )
        batch.tensors[F.OLD_LOGPROBS] = logprobs
        batch.tensors[F.ADVANTAGES] = batch[F.ADVANTAGES] * weights
    shapes: list[list[int]] = []
    hook = policy.chunks[0].register_forward_pre_hook(lambda _m, args: shapes.append(list(args[0].shape)))
    policy_metrics = policy.update(batch, UpdateContext(norm_length=norm_length))
    hook.remove()
    values = critic.compute_values(batch)
    batch.tensors[F.VALUES] = values
    critic_metrics = critic.update(batch, UpdateContext(norm_length=norm_length))
    return {
        "logprobs": logprobs,
        "policy_metrics": policy_metrics,
        "weights": policy.export_hf_state_dict(),
        "values": values,
        "critic_metrics": critic_metrics,
        "values_after": critic.compute_values(batch),
        "shapes": shapes,
    }


def main(out_dir: str, spec_file: str) -> None:
    out = Path(out_dir)
    spec = json.loads(Path(spec_file).read_text())
    tensors = torch.load(spec["batch_file"])
    for name, extra in spec["variants"].items():
        model_path = spec.get("models", {}).get(name, spec["model_path"])
        is_in_loss = name in spec.get("is_in_loss", ())
        result = run_variant(model_path, [*spec["overrides"], *extra], tensors, is_in_loss=is_in_loss)
        shapes = result.pop("shapes")
        (out / f"{name}_shapes{dist.get_rank()}.json").write_text(json.dumps(shapes))
        if dist.get_rank() == 0:
            torch.save(result, out / f"{name}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
