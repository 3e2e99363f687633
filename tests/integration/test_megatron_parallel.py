"""Megatron-core over gloo in several processes: TP=2, PP=2, DP=2 (and TP=2 x PP=2) equal HF / TP=1,
also at PP=2 for SmolLM2-135M's attention shape (9 query heads, 3 kv heads, tied; TP=3 of it:
test_megatron_gqa.py).

The workers (megatron_worker.py) load the HF checkpoints into the megatron model split by each
layout and return token log-probs of a padded batch; this process computes the reference with the
HF model. One 2-process launch runs all the 2-rank layouts (the import cost is paid once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from transformers import AutoModelForCausalLM  # noqa: E402

from nemo_azr.config.schema import TinyModelConfig  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.models.tiny import ensure_tiny_model  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_worker.py")
ATOL = 1e-5
TIMEOUT_S = 120
BUDGET = 13  # algorithm.max_tokens_per_microbatch of the token-budget scenarios
#: SmolLM2-135M's attention shape on the tiny model: 9 query heads in 3 kv groups (tied embeddings).
GQA_TINY = {"num_heads": 9, "num_kv_heads": 3, "hidden_size": 72, "intermediate_size": 144}


def hf_token_logprobs(model_dir: Path, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Reference: column t = log p(token t | real tokens < t); 0 where t or t-1 is padding."""
    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids, attn = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=attn, position_ids=batch["position_ids"]).logits
    lp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.nn.functional.pad(lp * ((attn[:, 1:] > 0) & (attn[:, :-1] > 0)), (1, 0))


@pytest.fixture(scope="module")
def setup(tiny_cache, tmp_path_factory):
    """Model folders (tied llama, 2 and 4 layers; untied qwen2 with one kv head and random QKV biases),
    the batch and the HF references."""
    root = tmp_path_factory.mktemp("megatron_parallel")
    llama = ensure_tiny_model(TinyModelConfig(cache_dir=tiny_cache))
    qwen_cfg = TinyModelConfig(
        family="qwen2", num_kv_heads=1, tie_word_embeddings=False, cache_dir=tiny_cache
    )
    qwen = AutoModelForCausalLM.from_pretrained(str(ensure_tiny_model(qwen_cfg)), dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in qwen.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    qwen.save_pretrained(str(root / "qwen2"))
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 1000, (n,), generator=g).tolist() for n in (3, 5, 1, 4)]
    responses = [torch.randint(1, 1000, (n,), generator=g).tolist() for n in (4, 2, 5, 0)]
    batch = pack_prompt_response(prompts, responses, None, pad_id=0)
    torch.save(batch, root / "batch.pt")
    llama4 = ensure_tiny_model(TinyModelConfig(num_layers=4, cache_dir=tiny_cache))  # for pp=2 x vpp=2
    gqa = ensure_tiny_model(TinyModelConfig(**GQA_TINY, cache_dir=tiny_cache))
    models = {"llama": llama, "qwen2": root / "qwen2", "llama4": llama4, "gqa": gqa}
    refs = {name: hf_token_logprobs(path, batch) for name, path in models.items()}
    ids = torch.randint(0, 1000, (2, 9), generator=g)  # unpadded rows for the full-logits check
    torch.save(ids, root / "ids.pt")
    hf_gqa = AutoModelForCausalLM.from_pretrained(str(gqa), dtype=torch.float32).eval()
    with torch.no_grad():
        gqa_logits = hf_gqa(input_ids=ids).logits
    return {
        "root": root,
        "models": models,
        "refs": refs,
        "batch_file": str(root / "batch.pt"),
        "ids_file": str(root / "ids.pt"),
        "gqa_logits": gqa_logits,
    }


def launch(world: int, scenarios: list[dict], out_dir: Path, torchrun: bool = False) -> dict[str, list[dict]]:
    """Run the worker on ``world`` ranks (one process each over a FileStore, or under torchrun);
    each scenario name -> the reports of all ranks."""
    out_dir.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    args = [str(WORKER), str(out_dir), json.dumps(scenarios)]
    if torchrun:  # exercises initialize_parallel's env:// start-up
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
        commands = [[*cmd, *args]]
    else:
        commands = [[sys.executable, *args, str(out_dir / "store"), str(r), str(world)] for r in range(world)]
    # stderr to files: a full pipe would block a rank while we wait on another one
    logs = [out_dir / f"launch{i}.log" for i in range(len(commands))]
    procs = []
    for command, log in zip(commands, logs):
        with open(log, "w") as handle:
            procs.append(subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env))
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for code, log in zip(codes, logs):
        assert code == 0, log.read_text()[-3000:]
    by_name: dict[str, list[dict]] = {}
    for rank in range(world):
        for report in json.loads((out_dir / f"rank{rank}.json").read_text())["reports"]:
            by_name.setdefault(report["name"], []).append(report)
    return by_name


def scenario(
    setup,
    name: str,
    family: str,
    tp: int,
    pp: int,
    micro: int = 0,
    vpp: int = 0,
    sp: bool = False,
    logits: bool = False,
    max_tokens: int = 0,
) -> dict:
    return {
        "max_tokens": max_tokens,
        "logits_ids_file": setup["ids_file"] if logits else None,
        "vpp": vpp,
        "sequence_parallel": sp,
        "name": name,
        "model_dir": str(setup["models"][family]),
        "batch_file": setup["batch_file"],
        "tp": tp,
        "pp": pp,
        "micro_batch_size": micro or None,
    }


@pytest.fixture(scope="module")
def two_ranks(setup):
    scenarios = [
        scenario(setup, "tp2-llama", "llama", tp=2, pp=1),
        scenario(setup, "tp2-qwen2", "qwen2", tp=2, pp=1),  # 1 kv head < tp: megatron replicates it
        scenario(setup, "pp2-llama", "llama", tp=1, pp=2, micro=2),  # 2 micro-batches through 1F1B
        scenario(setup, "pp2-qwen2", "qwen2", tp=1, pp=2, micro=1),  # untied output layer on stage 2
        scenario(setup, "dp2-llama", "llama", tp=1, pp=1),
        scenario(setup, "vpp2-llama4", "llama4", tp=1, pp=2, micro=2, vpp=2),  # interleaved schedule
        # token budget 13 over rows of 7, 7, 6, 4 tokens: micro-batches [1 x 7], [1 x 7], [2 x 6]
        # (megatron's variable_seq_lengths); interleaved, a filler makes them a multiple of pp
        scenario(setup, "pp2-llama-budget", "llama", tp=1, pp=2, micro=2, max_tokens=BUDGET),
        scenario(setup, "vpp2-llama4-budget", "llama4", tp=1, pp=2, micro=2, vpp=2, max_tokens=BUDGET),
        # sequence parallel: 7 compacted columns, padded to 8 to split over the 2 TP ranks
        scenario(setup, "tp2sp-llama", "llama", tp=2, pp=1, sp=True),
        scenario(setup, "tp2sp-qwen2", "qwen2", tp=2, pp=1, sp=True),
        # 9 heads / 3 kv heads, tied: the embedding on stage 1, megatron's copy of it on stage 2
        scenario(setup, "pp2-gqa", "gqa", tp=1, pp=2, micro=2, logits=True),
    ]
    return launch(2, scenarios, setup["root"] / "two_ranks")


def check_reports(reports: list[dict], ref: torch.Tensor) -> None:
    for report in reports:
        got = torch.tensor(report["logprobs"])
        torch.testing.assert_close(got, ref[report["rows"]], atol=ATOL, rtol=0)
    assert sum(r["gather_exact"] is True for r in reports) == 1  # rank 0 only, and bit-exact
    assert all(r["gather_exact"] in (None, True) for r in reports)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tp2_matches_hf(two_ranks, setup, family):
    reports = two_ranks[f"tp2-{family}"]
    assert sorted(r["tp_rank"] for r in reports) == [0, 1]
    assert all(r["rows"] == [0, 1, 2, 3] for r in reports)
    check_reports(reports, setup["refs"][family])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_tp2_sequence_parallel_matches_hf(two_ranks, setup, family):
    reports = two_ranks[f"tp2sp-{family}"]
    assert sorted(r["tp_rank"] for r in reports) == [0, 1]
    check_reports(reports, setup["refs"][family])


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_pp2_matches_hf_on_every_stage(two_ranks, setup, family):
    reports = two_ranks[f"pp2-{family}"]
    assert sorted(r["pp_rank"] for r in reports) == [0, 1]  # the first stage gets the broadcast result
    check_reports(reports, setup["refs"][family])


def test_pp2_gqa_with_tied_embeddings_matches_hf(two_ranks, setup):
    """SmolLM2-135M's attention shape (9 query heads in 3 kv groups) with tied embeddings at PP=2:
    log-probs of the padded batch and full logits (through the pipeline schedule) equal HF's."""
    reports = two_ranks["pp2-gqa"]
    assert sorted(r["pp_rank"] for r in reports) == [0, 1]
    check_reports(reports, setup["refs"]["gqa"])
    (logits,) = [torch.tensor(r["logits"]) for r in reports if r["logits"] is not None]
    torch.testing.assert_close(logits, setup["gqa_logits"], atol=ATOL, rtol=0)


def test_virtual_pipeline_matches_hf(two_ranks, setup):
    reports = two_ranks["vpp2-llama4"]
    assert sorted(r["pp_rank"] for r in reports) == [0, 1]
    check_reports(reports, setup["refs"]["llama4"])


@pytest.mark.parametrize(
    ("name", "family"), [("pp2-llama-budget", "llama"), ("vpp2-llama4-budget", "llama4")]
)
def test_pipelined_token_budget_micro_batches_match_hf(two_ranks, setup, name, family):
    """Micro-batches of three shapes through 1F1B and the interleaved schedule (plus a filler)."""
    from nemo_azr.models.training.microbatch import token_budget_groups

    lengths = torch.load(setup["batch_file"])["attention_mask"].sum(dim=1).tolist()
    assert token_budget_groups(lengths, BUDGET, packed=False) == [[0], [1], [2, 3]]
    reports = two_ranks[name]
    assert sorted(r["pp_rank"] for r in reports) == [0, 1]
    check_reports(reports, setup["refs"][family])


def test_dp2_each_replica_matches_hf_on_its_rows(two_ranks, setup):
    reports = two_ranks["dp2-llama"]
    assert sorted(tuple(r["rows"]) for r in reports) == [(0, 2), (1, 3)]
    check_reports(reports, setup["refs"]["llama"])


@pytest.mark.slow
def test_tp2_pp2_four_ranks_under_torchrun_match_hf(setup):
    tp2pp2 = [
        scenario(setup, "tp2pp2", "qwen2", tp=2, pp=2, micro=2),
        # token-budget micro-batches of 7, 7 and 6 columns, each padded for sequence parallelism
        scenario(setup, "tp2pp2-sp-budget", "qwen2", tp=2, pp=2, micro=2, sp=True, max_tokens=BUDGET),
    ]
    launched = launch(4, tp2pp2, setup["root"] / "four_ranks", torchrun=True)
    for name in ("tp2pp2", "tp2pp2-sp-budget"):
        reports = launched[name]
        assert sorted((r["tp_rank"], r["pp_rank"]) for r in reports) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        check_reports(reports, setup["refs"]["qwen2"])
