"""``nemo-azr train-rm`` on the ``megatron`` backend trains the reward model the hf backend trains: the
same Bradley-Terry losses, accuracies and gradient norms step by step and the same held-out scores,
on one process and at DP=2, TP=2 and PP=2 over gloo; the folder it writes is a transformers
sequence-classification model that scores as the megatron model did."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.cli import main  # noqa: E402
from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.models.megatron.reward_model import pair_micro_batch  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.rewards.reward_model import RewardModel, bradley_terry_loss  # noqa: E402
from nemo_azr.tasks.preference_data import PreferencePair, load_pairs_jsonl, write_pairs_jsonl  # noqa: E402
from nemo_azr.trainer.metrics import read_metrics  # noqa: E402
from nemo_azr.trainer.reward_model_training import train_reward_model  # noqa: E402
from tests.integration.torchrun import run_torchrun_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_reward_model_worker.py")
# Replies of two kinds (a polite answer, a terse refusal) and lengths that differ within a step, so
# padding and the read position matter.
PAIRS = [
    PreferencePair(
        f"p{i}", f"Question {i}: what is {i} + {i}?", f"Sure, it is {2 * i}." + " Done." * (i % 3), "No."
    )
    for i in range(24)
]
VARIANTS = {"dp2": ["parallel=tp1pp1"], "tp2": ["parallel=tp2pp1"], "pp2": ["parallel=tp1pp2"]}
STEPS = 4


def _overrides(cache: str, pairs_file: Path, *extra: str) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        f"preference.pairs_path={pairs_file}",
        f"reward_model.train_steps={STEPS}",
        "reward_model.train_pairs_per_step=4",
        "reward_model.train_lr=3e-4",
        "reward_model.heldout_pairs=8",
        "reward_model.eval_every=2",
        "optim.eps=1e-4",  # as in test_megatron_preference.py: reduction-order noise must not reach the weights
        *extra,
    ]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rm_pairs") / "pairs.jsonl"
    write_pairs_jsonl(PAIRS, path)
    return path


def _train_rm(overrides: list[str], out: Path) -> Path:
    assert main(["train-rm", *overrides, f"trainer.output_dir={out}"]) == 0
    return out / "reward_model"


@pytest.fixture(scope="module")
def hf_rm(tiny_cache, pairs_file, tmp_path_factory) -> Path:
    return _train_rm(_overrides(tiny_cache, pairs_file, "model.backend=hf"), tmp_path_factory.mktemp("hf_rm"))


def _assert_same_run(got: Path, want: Path) -> None:
    g, w = read_metrics(got / "metrics.jsonl"), read_metrics(want / "metrics.jsonl")
    assert [r["step"] for r in g] == [r["step"] for r in w] == list(range(STEPS + 1))
    assert w[-1]["heldout/loss"] < w[0]["heldout/loss"]  # the compared run learns
    for a, b in zip(g, w):
        assert a.keys() == b.keys()
        for key in b:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (b["step"], key)


def _heldout_scores(folder: Path, pairs_file: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The written model's scores of the held-out pairs (the last 8 after train-rm's seeded shuffle)."""
    import random

    pairs = load_pairs_jsonl(pairs_file)
    random.Random(0).shuffle(pairs)
    held = pairs[-8:]
    model = RewardModel(folder)
    messages = [[{"role": "user", "content": p.prompt}] for p in held]
    return model.score(messages, [p.chosen for p in held]), model.score(messages, [p.rejected for p in held])


def test_single_process_megatron_reward_model_matches_hf(hf_rm, tiny_cache, pairs_file, tmp_path):
    got = _train_rm(_overrides(tiny_cache, pairs_file, "model.backend=megatron", "parallel=tp1pp1"), tmp_path)
    _assert_same_run(got, hf_rm)
    # the written folder is a transformers model scoring as the megatron model did at the end
    chosen, rejected = _heldout_scores(got, pairs_file)
    loss, acc = bradley_terry_loss(chosen, rejected)
    final = read_metrics(got / "metrics.jsonl")[-1]
    assert float(loss) == pytest.approx(final["heldout/loss"], rel=1e-5)
    assert float(acc) == final["heldout/accuracy"]
    hf_chosen, hf_rejected = _heldout_scores(hf_rm, pairs_file)
    torch.testing.assert_close(chosen, hf_chosen, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(rejected, hf_rejected, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def two_process_rms(tiny_cache, pairs_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("megatron_rm")
    spec = {"overrides": _overrides(tiny_cache, pairs_file), "variants": VARIANTS}
    run_torchrun_worker(WORKER, out, spec, nproc=2, timeout=600)
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parallel_megatron_reward_model_matches_hf(name, two_process_rms, hf_rm, pairs_file):
    got = two_process_rms / name / "reward_model"
    _assert_same_run(got, hf_rm)
    hf_chosen, _ = _heldout_scores(hf_rm, pairs_file)
    chosen, _ = _heldout_scores(got, pairs_file)  # gathered from the shards / stages into one folder
    torch.testing.assert_close(chosen, hf_chosen, rtol=1e-4, atol=1e-5)


def test_pairs_stay_together_in_micro_batches():
    assert pair_micro_batch(4, 8) == 8  # all four pairs of a rank in one micro-batch
    assert pair_micro_batch(6, 8) == 6  # three pairs: the largest divisor of 6 within 4 pairs
    assert pair_micro_batch(5, 4) == 2  # five pairs, at most two a micro-batch: one at a time
    assert pair_micro_batch(4, 1) == 2  # never half a pair


def test_megatron_reward_model_layout_errors_name_the_fix(tiny_cache, pairs_file, tmp_path):
    base = _overrides(tiny_cache, pairs_file, "model.backend=megatron", f"trainer.output_dir={tmp_path}")
    with pytest.raises(ConfigError, match=r"parallel.micro_batch_size=3 must be even"):
        train_reward_model(load_config([*base, "parallel.micro_batch_size=3"]))
    with pytest.raises(ConfigError, match=r"micro_batch_size=6 does not divide a rank's 8 rows"):
        train_reward_model(load_config([*base, "parallel.micro_batch_size=6"]))
    with pytest.raises(ConfigError, match="max_tokens_per_microbatch must be 0"):
        train_reward_model(load_config([*base, "algorithm.max_tokens_per_microbatch=64"]))
