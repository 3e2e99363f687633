"""``algorithm.max_tokens_per_microbatch`` on the ``megatron`` backend: token-budget micro-batches
(first-fit decreasing, each its own rows and width) give the update of the default fixed-row
micro-batches: same no-grad log-probs, policy losses, grad norm and updated weights, and the same
critic values and critic update. On one process (TP=1), and over gloo (torchrun, 2 processes) at DP=2,
where the two ranks run 2 and 4 micro-batches (also with the distributed optimizer), at PP=2,
where the pipeline schedule sends micro-batches of five shapes, and at PP=2 with two virtual stages
(a 4-layer model): megatron's interleaved schedule needs a multiple of pp micro-batches, so after the
five budget micro-batches it runs a filler one, which must add no loss and no gradient.

The forward-only pipelined passes with a budget (1F1B, and the interleaved schedule with a filler
micro-batch) are also checked against HF log-probs in test_megatron_parallel.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.algorithms.off_policy import rollout_is_weights  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.models.training.microbatch import token_budget_groups  # noqa: E402
from tests.integration.megatron_budget_worker import run_variant  # noqa: E402
from tests.integration.torchrun import run_torchrun_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_budget_worker.py")
ATOL = 1e-5
BUDGET = 24  # rows x width per micro-batch
PROMPTS = (2, 6, 3, 9, 4, 5, 1, 7)
RESPONSES = (1, 8, 2, 11, 3, 4, 1, 9)
LENGTHS = [p + r for p, r in zip(PROMPTS, RESPONSES)]  # 3, 14, 5, 20, 7, 9, 2, 16
ROWS = 2  # algorithm.micro_batch_size: the default micro-batches
TWO_PROCESS = {  # name -> (overrides, data-parallel size)
    "dp2_rows": (["parallel=tp1pp1"], 2),
    "dp2_budget": (["parallel=tp1pp1", f"algorithm.max_tokens_per_microbatch={BUDGET}"], 2),
    "dp2_distopt_budget": (
        [
            "parallel=tp1pp1",
            "parallel.distributed_optimizer=true",
            f"algorithm.max_tokens_per_microbatch={BUDGET}",
        ],
        2,
    ),
    "pp2_rows": (["parallel=tp1pp2"], 1),
    "pp2_budget": (["parallel=tp1pp2", f"algorithm.max_tokens_per_microbatch={BUDGET}"], 1),
}
# The interleaved schedule (2 stages x 2 virtual stages: one layer per chunk) on a 4-layer model.
FOUR_LAYERS = "model.tiny.num_layers=4"  # what the layout checks see (the weights: four_layer_model_path)
VPP = [FOUR_LAYERS, "parallel=tp1pp2", "parallel.virtual_pipeline_model_parallel_size=2"]
VIRTUAL = {  # name -> overrides, run in the same two processes
    "vpp2_rows": VPP,
    "vpp2_budget": [*VPP, f"algorithm.max_tokens_per_microbatch={BUDGET}"],
}
# Token-level importance weights computed in the loss from the update's own log-probs (decision
# 127): the same update as weighting the advantages first, and the weight maxima combined by max
# over micro-batches, pipeline micro-batches and data-parallel ranks.
TIS = ["algorithm.off_policy_correction=tis", "algorithm.is_cap=1.2"]
IS_IN_LOSS = {  # name -> overrides, run in the same two processes with is_in_loss
    "dp2_is_in_loss": ["parallel=tp1pp1", *TIS],
    "pp2_is_in_loss": ["parallel=tp1pp2", *TIS, f"algorithm.max_tokens_per_microbatch={BUDGET}"],
}


def overrides(cache: str) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        "model.backend=megatron",
        "trainer.device=cpu",
        "logger=quiet",
        "data.prompts_per_step=2",
        "generation.n_samples=4",  # 8 rows per step, the global batch
        f"algorithm.micro_batch_size={ROWS}",
        "algorithm.shuffle_mini_batches=false",
        "algorithm.entropy_coef=0.01",  # the entropies go through the same micro-batches
        "critic.mini_batch_size=4",  # two critic steps: the second one trains the trunk too
        "critic.optim.lr=0.01",
        # Adam's eps above float noise (as in test_megatron_train.py): near-zero gradients must not
        # turn reduction-order differences into 1e-5 weight differences.
        "optim.eps=1e-4",
        "critic.optim.eps=1e-4",
    ]


@pytest.fixture(scope="module")
def batch(tiny_model_path) -> dict[str, torch.Tensor]:
    """Long-tailed rows (3 to 20 tokens) with advantages, returns and old-log-prob noise."""
    vocab = json.loads((Path(tiny_model_path) / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in PROMPTS]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in RESPONSES]
    tensors = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = tensors[F.LOSS_MASK]
    tensors[F.ADVANTAGES] = torch.randn(len(PROMPTS), 1, generator=g) * mask
    tensors[F.RETURNS] = torch.randn(mask.shape, generator=g) * mask
    tensors["old_noise"] = 0.3 * torch.randn(mask.shape, generator=g)  # ratios != 1: some clip
    assert tensors[F.ATTENTION_MASK].sum(dim=1).tolist() == LENGTHS
    return tensors


@pytest.fixture(scope="module")
def reference(tiny_model_path, tiny_cache, batch) -> dict:
    """One process, the default micro-batches of ``ROWS`` rows."""
    return run_variant(str(tiny_model_path), [*overrides(tiny_cache), "parallel=tp1pp1"], batch)


@pytest.fixture(scope="module")
def four_layer_model_path(tiny_cache) -> Path:
    """The tiny model with 4 layers (pp=2 x 2 virtual stages), same vocabulary."""
    from nemo_azr.config.schema import TinyModelConfig
    from nemo_azr.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(num_layers=4, cache_dir=tiny_cache))


@pytest.fixture(scope="module")
def reference_four_layers(four_layer_model_path, tiny_cache, batch) -> dict:
    """:func:`reference` of the 4-layer model."""
    layout = [*overrides(tiny_cache), FOUR_LAYERS, "parallel=tp1pp1"]
    return run_variant(str(four_layer_model_path), layout, batch)


def expected_shapes(rows: list[int], budget: int) -> list[list[int]]:
    """``[rows, width]`` of each micro-batch of these rows (in order): a width is the longest row."""
    lengths = [LENGTHS[r] for r in rows]
    groups = (
        token_budget_groups(lengths, budget, packed=False)
        if budget
        else [list(range(i, min(i + ROWS, len(rows)))) for i in range(0, len(rows), ROWS)]
    )
    return [[len(g), max(lengths[i] for i in g)] for g in groups]


def assert_same_update(got: dict, want: dict) -> None:
    """Log-probs, policy and critic metrics, updated weights and values of ``want`` (and they moved)."""
    torch.testing.assert_close(got["logprobs"], want["logprobs"], atol=ATOL, rtol=0)
    actor, ref = got["policy_metrics"], want["policy_metrics"]
    assert ref["actor/grad_norm"] > 0 and ref["actor/clip_frac"] > 0 and ref["actor/optimizer_steps"] == 1
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy", "actor/clip_frac"):
        assert actor[key] == pytest.approx(ref[key], abs=ATOL), key
    assert actor["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-5)
    for key, value in want["weights"].items():
        if key in got["weights"]:  # a tied lm_head is the embedding
            torch.testing.assert_close(got["weights"][key], value, atol=ATOL, rtol=0, msg=key)
    critic, ref = got["critic_metrics"], want["critic_metrics"]
    assert ref["critic/grad_norm"] > 0 and ref["critic/optimizer_steps"] == 2
    for key in ("critic/vf_loss", "critic/loss"):
        assert critic[key] == pytest.approx(ref[key], abs=ATOL), key
    assert critic["critic/grad_norm"] == pytest.approx(ref["critic/grad_norm"], rel=1e-5)
    assert want["values_after"].abs().sum() > 0  # the critic moved
    for key in ("values", "values_after"):
        torch.testing.assert_close(got[key], want[key], atol=ATOL, rtol=0, msg=key)


def test_reference_update_moves_the_weights(reference, tiny_model_path):
    from safetensors.torch import load_file

    start = load_file(Path(tiny_model_path) / "model.safetensors")
    assert max(float((reference["weights"][k] - v).abs().max()) for k, v in start.items()) > 1e-4
    assert reference["shapes"] == expected_shapes(list(range(8)), 0)


def test_single_process_token_budget_matches_row_micro_batches(reference, tiny_model_path, tiny_cache, batch):
    budget = [*overrides(tiny_cache), "parallel=tp1pp1", f"algorithm.max_tokens_per_microbatch={BUDGET}"]
    got = run_variant(str(tiny_model_path), budget, batch)
    # Five micro-batches of 1 to 3 rows, each as wide as its longest row.
    assert got["shapes"] == expected_shapes(list(range(8)), BUDGET)
    assert len(got["shapes"]) == 5 and len({tuple(s) for s in got["shapes"]}) == 5
    assert_same_update(got, reference)


@pytest.fixture(scope="module")
def two_process_run(tiny_model_path, four_layer_model_path, tiny_cache, batch, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("megatron_budget")
    torch.save(batch, out / "batch.pt")
    spec = {
        "model_path": str(tiny_model_path),
        "overrides": overrides(tiny_cache),
        "variants": {**{name: extra for name, (extra, _) in TWO_PROCESS.items()}, **VIRTUAL, **IS_IN_LOSS},
        "models": dict.fromkeys(VIRTUAL, str(four_layer_model_path)),
        "is_in_loss": list(IS_IN_LOSS),
        "batch_file": str(out / "batch.pt"),
    }
    run_torchrun_worker(WORKER, out, spec, timeout=300)
    return out


@pytest.mark.parametrize("name", list(TWO_PROCESS))
def test_two_process_token_budget_matches_row_micro_batches(name, two_process_run, reference):
    extra, dp = TWO_PROCESS[name]
    budget = BUDGET if any("max_tokens" in e for e in extra) else 0
    for rank in range(2):
        rows = list(range(rank % dp, 8, dp))  # the data-parallel rank's strided rows
        shapes = json.loads((two_process_run / f"{name}_shapes{rank}.json").read_text())
        # Pipelined fixed rows: megatron's one p2p shape (the batch's longest row); else each
        # micro-batch as wide as its longest row (a budget: pipelined with five shapes).
        want = [[ROWS, max(LENGTHS)]] * 4 if name == "pp2_rows" else expected_shapes(rows, budget)
        assert shapes == want, rank
    if budget and dp == 2:  # the data-parallel ranks run different numbers of micro-batches
        assert [len(expected_shapes(list(range(r, 8, 2)), budget)) for r in (0, 1)] == [2, 4]
    assert_same_update(torch.load(two_process_run / f"{name}.pt"), reference)


@pytest.mark.parametrize("name", list(VIRTUAL))
def test_interleaved_schedule_update_matches_row_micro_batches(name, two_process_run, reference_four_layers):
    """A policy and critic update through megatron's interleaved schedule. Fixed rows: four
    micro-batches of one shape. A budget: five micro-batches (not a multiple of pp=2) of five shapes,
    then a filler, one row of the smallest of them, whose loss and gradient must be zero: the update
    is still the one-process fixed-row update."""
    if name == "vpp2_rows":
        want = [[ROWS, max(LENGTHS)]] * 4
    else:
        want = expected_shapes(list(range(8)), BUDGET)
        assert len(want) == 5
        want = [*want, [1, min(want, key=lambda s: s[0] * s[1])[1]]]  # the filler: [1, 14]
    for rank in range(2):  # every stage runs every micro-batch (filler included) on its first chunk
        assert json.loads((two_process_run / f"{name}_shapes{rank}.json").read_text()) == want, rank
    assert_same_update(torch.load(two_process_run / f"{name}.pt"), reference_four_layers)


@pytest.fixture(scope="module")
def is_reference(tiny_model_path, tiny_cache, batch) -> dict:
    """One process, the advantages weighted by the importance weights before the update."""
    return run_variant(str(tiny_model_path), [*overrides(tiny_cache), "parallel=tp1pp1", *TIS], batch)


def assert_same_is_update(got: dict, want: dict) -> None:
    """The update, the importance-weight metrics and the weights of ``want``; some weights capped."""
    actor, ref = got["policy_metrics"], want["policy_metrics"]
    assert 0 < actor["off_policy/clipped_frac"] < 1 and actor["off_policy/is_ratio_max"] > 1.2
    assert actor["off_policy/is_weight_max"] == pytest.approx(1.2)
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy"):
        assert actor[key] == pytest.approx(ref[key], abs=ATOL), key
    assert actor["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-5)
    for key, value in want["weights"].items():
        torch.testing.assert_close(got["weights"][key], value, atol=ATOL, rtol=0, msg=key)


def test_single_process_weights_in_the_loss_match_weighted_advantages(
    is_reference, tiny_model_path, tiny_cache, batch
):
    in_loss = [*overrides(tiny_cache), "parallel=tp1pp1", *TIS]
    got = run_variant(str(tiny_model_path), in_loss, batch, is_in_loss=True)
    assert_same_is_update(got, is_reference)
    # The explicit path's metrics, from rollout_is_weights on the whole batch.
    mask = batch[F.LOSS_MASK]
    noise = batch["old_noise"] * mask
    _, want = rollout_is_weights(got["logprobs"], got["logprobs"] - noise, mask, mode="tis", cap=1.2)
    for key, value in want.items():
        assert got["policy_metrics"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


@pytest.mark.parametrize("name", list(IS_IN_LOSS))
def test_two_process_weights_in_the_loss_match_weighted_advantages(name, two_process_run, is_reference):
    assert_same_is_update(torch.load(two_process_run / f"{name}.pt"), is_reference)
