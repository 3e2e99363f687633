"""One rank of the megatron-core parallel checks (run by test_megatron_parallel.py over gloo).

Every rank joins a FileStore process group; then, for each scenario in turn (one import cost for
all of them), it sets up megatron's groups for the scenario's layout, builds the model from a local
HF folder, loads the HF weights and computes token log-probs of the batch the test saved (its
data-parallel share of the rows). It writes OUT_DIR/rank<R>.json with a report per scenario: its
ranks, the row indices it computed, the log-probs and (rank 0) whether the gathered HF state dict
equals the checkpoint bit for bit.

    python megatron_worker.py OUT_DIR SCENARIOS_JSON STORE_FILE RANK WORLD   # one process per rank
    python -m torch.distributed.run --standalone --nproc_per_node N megatron_worker.py OUT_DIR SCENARIOS_JSON

SCENARIOS_JSON: a list of ``{"name", "model_dir", "batch_file", "tp", "pp", "micro_batch_size"}``
(optional: ``"vpp"``, ``"sequence_parallel"``, ``"max_tokens"``: token-budget micro-batches, and
``"logits_ids_file"``: rank 0 also reports the full logits of those unpadded rows).
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist


def gathered_equals_checkpoint(model, hf_config, layout, model_dir: str) -> bool | None:
    from safetensors.torch import load_file

    from nemo_azr.models.megatron.hf_adapter import gather_hf_state_dict

    full = gather_hf_state_dict(model, hf_config, layout)
    if full is None:
        return None
    want = load_file(f"{model_dir}/model.safetensors")
    return full.keys() == want.keys() and all(torch.equal(full[k], want[k]) for k in want)


def run_scenario(scenario: dict) -> dict:
    """Build, load and run one layout; the report of this rank."""
    from megatron.core import parallel_state as ps
    from transformers import AutoConfig

    from nemo_azr.distributed.parallel import ParallelLayout, initialize_parallel
    from nemo_azr.models.megatron.builder import build_gpt_model
    from nemo_azr.models.megatron.hf_adapter import load_hf_into_megatron
    from nemo_azr.models.megatron.logprobs import megatron_token_logprobs

    model_dir = scenario["model_dir"]
    layout = ParallelLayout(
        tp=scenario["tp"],
        pp=scenario["pp"],
        vpp=scenario.get("vpp", 0),
        sequence_parallel=scenario.get("sequence_parallel", False),
    )
    dp = initialize_parallel(layout, seed=1234)  # replaces the previous scenario's megatron groups
    hf_config = AutoConfig.from_pretrained(model_dir)
    if layout.vpp:  # one model chunk per virtual stage
        model = [build_gpt_model(hf_config, layout, vp_stage=v).eval() for v in range(layout.vpp)]
    else:
        model = build_gpt_model(hf_config, layout).eval()
    load_hf_into_megatron(model, model_dir, layout)

    data = torch.load(scenario["batch_file"])
    rows = list(range(ps.get_data_parallel_rank(), data["input_ids"].shape[0], dp))
    logprobs = megatron_token_logprobs(
        model,
        data["input_ids"][rows],
        data["attention_mask"][rows],
        data["position_ids"][rows],
        micro_batch_size=scenario["micro_batch_size"],
        max_tokens=scenario.get("max_tokens", 0),
    )
    # Full logits (TP shards gathered, through the pipeline schedule): reported by global rank 0.
    logits = None
    if scenario.get("logits_ids_file"):
        from nemo_azr.models.megatron.parity import megatron_logits

        logits = megatron_logits(model, torch.load(scenario["logits_ids_file"]))
    return {
        "logits": logits.tolist() if logits is not None and dist.get_rank() == 0 else None,
        "name": scenario["name"],
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_rank": ps.get_data_parallel_rank(),
        "rows": rows,
        "logprobs": logprobs.tolist(),
        "gather_exact": gathered_equals_checkpoint(model, hf_config, layout, model_dir),
    }


def main() -> None:
    out_dir, scenarios = sys.argv[1], json.loads(sys.argv[2])
    warnings.filterwarnings("ignore")  # megatron warns about missing apex / TE on import
    torch.set_num_threads(1)
    from nemo_azr.distributed.parallel import destroy_parallel

    if len(sys.argv) > 3:  # launched by the test: join a FileStore group (no port needed)
        store_file, rank, world = sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        dist.init_process_group("gloo", store=dist.FileStore(store_file, world), rank=rank, world_size=world)
    # else launched by torchrun: initialize_parallel reads RANK / WORLD_SIZE / MASTER_* itself
    reports = [run_scenario(s) for s in scenarios]
    rank = dist.get_rank()
    dist.barrier()
    destroy_parallel()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:  # a file each: torchrun interleaves stdout
        json.dump({"rank": rank, "reports": reports}, f)


if __name__ == "__main__":
    main()
