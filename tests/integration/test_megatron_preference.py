"""DPO / IPO / KTO on the ``megatron`` backend train like on ``hf``: the same losses, implicit-reward
metrics and gradient norms step by step, on one process and at DP=2, TP=2 and PP=2 over gloo (the
pair-major row order keeps each pair's two rows on one rank and in one micro-batch; KTO's reference
point is taken over all mismatched rows before the labelled rows are split over the ranks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist

pytest.importorskip("megatron.core")

from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.preflight import load_config  # noqa: E402
from nemo_azr.tasks.preference_data import PreferencePair, write_pairs_jsonl  # noqa: E402
from nemo_azr.trainer.metrics import read_metrics  # noqa: E402
from nemo_azr.trainer.trainer import Trainer  # noqa: E402
from tests.integration.torchrun import run_torchrun_worker  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORKER = Path(__file__).with_name("megatron_preference_worker.py")
ATOL = 1e-5
KEYS = (
    "preference/loss",
    "preference/reward_margin",
    "preference/rewards_chosen",
    "preference/reward_accuracy",
)
PAIRS = [
    PreferencePair(f"p{i}", f"What is {i} + {i}?", str(2 * i), f"{2 * i + 1} maybe") for i in range(1, 9)
]
VARIANTS = {
    "dp2": ["parallel=tp1pp1", "preference.loss=dpo"],
    "tp2": ["parallel=tp2pp1", "preference.loss=dpo"],
    "pp2": ["parallel=tp1pp2", "preference.loss=dpo"],
    "kto_dp2": ["parallel=tp1pp1", "preference.loss=kto"],
    "kto_pp2": ["parallel=tp1pp2", "preference.loss=kto"],
}


#: single-process runs by name: the loss, and RPO (DPO + the chosen reply's NLL)
LOSS_OVERRIDES = {
    "dpo": ["preference.loss=dpo"],
    "ipo": ["preference.loss=ipo"],
    "kto": ["preference.loss=kto"],
    "rpo": ["preference.loss=dpo", "preference.nll_weight=1.0"],
}


def _overrides(cache, pairs_file, *extra) -> list[str]:
    return [
        f"model.tiny.cache_dir={cache}",
        "logger=quiet",
        "trainer.device=cpu",
        "sft_warmup.steps=0",
        f"preference.pairs_path={pairs_file}",
        "data.prompts_per_step=4",
        "trainer.max_steps=3",
        "optim.lr=0.003",
        "optim.eps=1e-4",  # as in test_megatron_train.py: reduction-order noise must not reach the weights
        "algorithm.micro_batch_size=2",  # hf: one pair per micro-batch
        "parallel.micro_batch_size=2",  # megatron: one pair per micro-batch, two per rank at DP=2
        *extra,
    ]


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    write_pairs_jsonl(PAIRS, path)
    return path


def _run(cfg_overrides: list[str], out: Path) -> list[dict]:
    assert Trainer(load_config([*cfg_overrides, f"trainer.output_dir={out}"])).fit().status == "completed"
    return read_metrics(out / "metrics.jsonl")


def _assert_same(got: list[dict], want: list[dict], loss: str = "dpo") -> None:
    assert len(got) == len(want) == 3
    assert want[0]["preference/grad_norm"] > 0 and want[-1]["preference/loss"] < want[0]["preference/loss"]
    keys = (*KEYS, "preference/kl_reference") if loss == "kto" else KEYS
    for g, w in zip(got, want):
        for key in keys:
            if loss == "kto" and g["step"] == 1 and key == "preference/reward_accuracy":
                continue  # at the reference every log-ratio is 0 up to rounding: its side is noise
            # relative too: IPO's squared loss is ~6 here, and the two backends' fp32 sums, in
            # different orders, differ by 2e-5 on an AMD EPYC (a few ulp of each log-prob, squared)
            assert g[key] == pytest.approx(w[key], rel=1e-5, abs=ATOL), (g["step"], key)
        assert g["preference/grad_norm"] == pytest.approx(w["preference/grad_norm"], rel=1e-4)
        if loss == "kto":  # every pair's two rows, trained unpaired
            assert g["preference/examples"] == w["preference/examples"] == 8
        else:
            assert g["preference/pairs"] == w["preference/pairs"] == 4


@pytest.fixture(scope="module")
def hf_runs(tiny_cache, pairs_file, tmp_path_factory):
    cache: dict[str, list[dict]] = {}

    def run(loss: str) -> list[dict]:
        if loss not in cache:
            out = tmp_path_factory.mktemp(f"hf_{loss}")
            cache[loss] = _run(
                _overrides(tiny_cache, pairs_file, "model.backend=hf", *LOSS_OVERRIDES[loss]), out
            )
        return cache[loss]

    return run


@pytest.mark.parametrize("loss", list(LOSS_OVERRIDES))
def test_single_process_megatron_preference_steps_match_hf(loss, hf_runs, tiny_cache, pairs_file, tmp_path):
    got = _run(
        _overrides(
            tiny_cache, pairs_file, "model.backend=megatron", "parallel=tp1pp1", *LOSS_OVERRIDES[loss]
        ),
        tmp_path,
    )
    want = hf_runs(loss)
    _assert_same(got, want, "kto" if loss == "kto" else "dpo")
    if loss == "rpo":  # the NLL term is in the loss, alike on both backends
        for g, w in zip(got, want):
            assert g["preference/chosen_nll"] == pytest.approx(w["preference/chosen_nll"], rel=1e-5)
            assert w["preference/loss"] > w["preference/chosen_nll"] > 0


@pytest.fixture(scope="module")
def two_process_runs(tiny_cache, pairs_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("megatron_dpo")
    spec = {"overrides": _overrides(tiny_cache, pairs_file), "variants": VARIANTS}
    run_torchrun_worker(WORKER, out, spec, nproc=2, timeout=600)
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_parallel_megatron_preference_steps_match_hf(name, two_process_runs, hf_runs):
    loss = "kto" if name.startswith("kto") else "dpo"
    _assert_same(read_metrics(two_process_runs / name / "metrics.jsonl"), hf_runs(loss), loss)


def test_megatron_preference_layout_errors_name_the_fix(tiny_cache, pairs_file):
    base = _overrides(tiny_cache, pairs_file, "model.backend=megatron", "preference.loss=dpo")
    with pytest.raises(ConfigError, match="parallel.micro_batch_size=1 must be even"):
        load_config([*base, "parallel.micro_batch_size=1"])
    with pytest.raises(ConfigError, match="max_tokens_per_microbatch must be 0"):
        load_config([*base, "algorithm.max_tokens_per_microbatch=64"])
    # KTO's rows stand alone: an odd micro-batch and a token budget are fine
    kto = _overrides(tiny_cache, pairs_file, "model.backend=megatron", "preference.loss=kto")
    load_config([*kto, "parallel.micro_batch_size=1", "algorithm.max_tokens_per_microbatch=64"])
