"""The ``parallel`` group: layouts resolved by hand, each bad layout one ConfigError line, CLI wiring."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import pytest

from nemo_azr.cli import main
from nemo_azr.config.parallel_validate import MEGATRON_MISSING, ResolvedLayout, validate_parallel
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.errors import ConfigError
from nemo_azr.preflight import load_config
from tests.cli_errors import cli_error

HAS_MEGATRON = importlib.util.find_spec("megatron") is not None and (
    importlib.util.find_spec("megatron.core") is not None
)


def _cfg(**parallel: object) -> NemoAzrConfig:
    """Schema defaults: 8 prompts x 8 samples = 64 rows per step, whole-batch update, trainer.device=cpu."""
    cfg = NemoAzrConfig()
    for key, value in parallel.items():
        setattr(cfg.parallel, key, value)
    return cfg


def _layout(cfg: NemoAzrConfig, world: int = 1, heads: int = 4, kv: int = 2, layers: int = 2, **kw: object):
    return validate_parallel(
        cfg, world_size=world, num_attention_heads=heads, num_key_value_heads=kv, num_layers=layers, **kw
    )


# --- good layouts: dp and micro-batches worked out by hand -----------------------------------------
def test_default_layout_on_one_process():
    # dp = 1 / (1 x 1) = 1; global batch = 64 rows; derived micro-batch: the largest divisor of 64 up
    # to algorithm.micro_batch_size 32 = 32, so 64 / (32 x 1) = 2 micro-batches
    assert _layout(_cfg(), cuda=False) == ResolvedLayout(
        tp=1, pp=1, dp=1, micro_batch_size=32, global_batch_size=64, num_micro_batches=2, backend="gloo"
    )


@pytest.mark.parametrize(
    "parallel,alg_micro,world,want",
    [
        ({}, 32, 3, 1),  # 64 rows do not split over dp 3: 1 (the batch check then fails)
        ({}, 24, 2, 16),  # 32 rows per rank: divisors up to 24 -> 16
        ({"pipeline_model_parallel_size": 2}, 32, 2, 32),  # 64 rows: 2 micro-batches of 32 >= pp 2
        ({"pipeline_model_parallel_size": 2, "global_batch_size": 32}, 32, 2, 16),  # 32 alone: 1 < pp
        ({"pipeline_model_parallel_size": 2}, 5, 2, 4),  # up to 5, dividing 64 -> 4
        ({"global_batch_size": 48, "data_parallel_size": 0}, 32, 4, 12),  # 12 rows per rank
    ],
)
def test_derived_micro_batch(parallel, alg_micro, world, want):
    from nemo_azr.config.parallel_validate import _derived_micro_batch

    cfg = _cfg(**parallel)
    cfg.algorithm.micro_batch_size = alg_micro
    dp = world // cfg.parallel.pipeline_model_parallel_size
    assert _derived_micro_batch(cfg, dp, cfg.parallel.pipeline_model_parallel_size, interleaved=False) == want


def test_derived_micro_batch_keeps_interleaved_micro_batches_a_multiple_of_pp():
    from nemo_azr.config.parallel_validate import _derived_micro_batch

    cfg = _cfg(pipeline_model_parallel_size=4, global_batch_size=24)
    cfg.algorithm.micro_batch_size = 8
    # 24 rows: 8 -> 3 micro-batches (not a multiple of 4); 6 -> 4 micro-batches
    assert _derived_micro_batch(cfg, 1, 4, interleaved=False) == 6
    assert _derived_micro_batch(cfg, 1, 4, interleaved=True) == 6
    cfg.parallel.global_batch_size = 48  # 8 -> 6 micro-batches: enough, but not a multiple of 4
    assert _derived_micro_batch(cfg, 1, 4, interleaved=False) == 8
    assert _derived_micro_batch(cfg, 1, 4, interleaved=True) == 6


def test_tp2_pp2_on_eight_processes_derives_dp2():
    # dp = 8 / (2 x 2) = 2; 64 rows / (micro 2 x dp 2) = 16 micro-batches per rank
    got = _layout(_cfg(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, micro_batch_size=2), 8)
    assert (got.tp, got.pp, got.dp, got.global_batch_size, got.num_micro_batches) == (2, 2, 2, 64, 16)


def test_explicit_dp_and_global_batch():
    # 2 x 1 x 2 = 4 processes; global 32 / (micro 4 x dp 2) = 4 micro-batches
    cfg = _cfg(tensor_model_parallel_size=2, data_parallel_size=2, global_batch_size=32, micro_batch_size=4)
    got = _layout(cfg, world=4)
    assert (got.dp, got.global_batch_size, got.num_micro_batches) == (2, 32, 4)


def test_global_batch_follows_algorithm_mini_batch():
    cfg = _cfg()
    cfg.algorithm.mini_batch_size = 16  # 16 rows per optimizer step; dp 4 -> 4 rows per rank
    got = _layout(cfg, world=4)
    assert (got.dp, got.global_batch_size, got.micro_batch_size, got.num_micro_batches) == (4, 16, 4, 1)
    cfg.parallel.micro_batch_size = 1  # explicit: 4 micro-batches of 1
    got = _layout(cfg, world=4)
    assert (got.dp, got.global_batch_size, got.micro_batch_size, got.num_micro_batches) == (4, 16, 1, 4)


def test_selfplay_derives_one_micro_batch_per_rank():
    cfg = _cfg(micro_batch_size=2)
    cfg.rollout.workflow = "azr"  # batch sizes vary per step
    got = _layout(cfg, world=2)
    assert (got.dp, got.global_batch_size, got.num_micro_batches) == (2, 4, 1)


def test_interleaved_layout():
    # 8 layers / (pp 2 x vpp 2) = 2 layers per chunk; 64 rows / 8 = 8 micro-batches, a multiple of pp 2
    cfg = _cfg(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, micro_batch_size=8)
    got = _layout(cfg, world=2, layers=8)
    assert (got.pp, got.vpp, got.dp, got.num_micro_batches) == (2, 2, 1, 8)


def test_kv_heads_may_be_fewer_than_tp():
    # megatron-core: num_query_groups a multiple OR a divisor of tp; 8 heads, 2 kv heads, tp 4
    got = _layout(_cfg(tensor_model_parallel_size=4), world=4, heads=8, kv=2)
    assert (got.tp, got.dp) == (4, 1)


def test_tp3_for_nine_heads_in_three_kv_groups():
    # SmolLM2-135M: 9 heads, 3 kv heads, 30 layers. tp 3 splits the kv groups (one each); tp 9
    # replicates each kv head over 3 ranks; with pp 2 (15 layers per stage) 6 processes are one replica.
    got = _layout(_cfg(tensor_model_parallel_size=3), world=3, heads=9, kv=3, layers=30)
    assert (got.tp, got.pp, got.dp, got.global_batch_size) == (3, 1, 1, 64)
    assert _layout(_cfg(tensor_model_parallel_size=9), world=9, heads=9, kv=3, layers=30).tp == 9
    cfg = _cfg(tensor_model_parallel_size=3, pipeline_model_parallel_size=2)
    got = _layout(cfg, world=6, heads=9, kv=3, layers=30)
    assert (got.tp, got.pp, got.dp, got.num_micro_batches) == (3, 2, 1, 2)


def test_cuda_resolves_backend_and_allows_gpu_features():
    cfg = _cfg(tensor_model_parallel_size=2, sequence_parallel=True, distributed_optimizer=True)
    cfg.trainer.device = "cuda"
    got = _layout(cfg, world=2, cuda=True)
    assert got.backend == "nccl"
    cfg.parallel.backend = "gloo"
    assert _layout(cfg, world=2, cuda=True).backend == "gloo"


def test_sequence_parallel_and_distributed_optimizer_run_on_cpu():
    # Both run over gloo with the CPU shims (tests/integration/test_megatron_*): not refused.
    cfg = _cfg(tensor_model_parallel_size=2, sequence_parallel=True, distributed_optimizer=True)
    assert _layout(cfg, world=4, cuda=False).backend == "gloo"


def test_use_te_from_the_command_line_is_case_blind():
    # `parallel.use_te=False` reaches the str field as "False"
    assert _layout(_cfg(use_te="False"), cuda=False).use_te is False


# --- bad layouts: one line naming the key ----------------------------------------------------------
def _set(**kw: object) -> Callable[[NemoAzrConfig], None]:
    def apply(cfg: NemoAzrConfig) -> None:
        for dotted, value in kw.items():
            section, key = dotted.split("__")
            setattr(getattr(cfg, section), key, value)

    return apply


BAD = [
    # (config changes, validate_parallel arguments, expected part of the message)
    (
        _set(parallel__tensor_model_parallel_size=3),
        {"world": 3},
        "parallel.tensor_model_parallel_size=3 must divide the model's 4 attention heads; try 1, 2 or 4",
    ),
    (
        _set(parallel__tensor_model_parallel_size=3),
        {"world": 3, "heads": 12, "kv": 4},
        "parallel.tensor_model_parallel_size=3 must divide or be a multiple of the model's 4 key/value heads; "
        "try 1, 2, 4 or 12",
    ),
    (  # SmolLM2-135M's heads at tp 2
        _set(parallel__tensor_model_parallel_size=2),
        {"world": 2, "heads": 9, "kv": 3, "layers": 30},
        "parallel.tensor_model_parallel_size=2 must divide the model's 9 attention heads; try 1, 3 or 9",
    ),
    (
        _set(parallel__pipeline_model_parallel_size=3),
        {"world": 3},
        "parallel.pipeline_model_parallel_size=3 must divide the model's 2 layers; try 1 or 2",
    ),
    (
        _set(parallel__pipeline_model_parallel_size=2, parallel__virtual_pipeline_model_parallel_size=2),
        {"world": 2, "layers": 6},
        "parallel.virtual_pipeline_model_parallel_size=2 x parallel.pipeline_model_parallel_size=2 = 4 "
        "must divide the model's 6 layers; try parallel.virtual_pipeline_model_parallel_size=1 or 3, or 0",
    ),
    (
        _set(parallel__virtual_pipeline_model_parallel_size=2),
        {},
        "parallel.virtual_pipeline_model_parallel_size=2 (interleaved schedule) needs "
        "parallel.pipeline_model_parallel_size > 1",
    ),
    (  # 3 prompts x 8 samples = 24 rows / micro 8 = 3 micro-batches, not a multiple of pp 2
        _set(
            parallel__pipeline_model_parallel_size=2,
            parallel__virtual_pipeline_model_parallel_size=1,
            parallel__micro_batch_size=8,
            data__prompts_per_step=3,
        ),
        {"world": 2},
        "= 3) to be a multiple of parallel.pipeline_model_parallel_size=2",
    ),
    (
        _set(parallel__tensor_model_parallel_size=2),
        {"world": 3},
        "the world size 3 is not divisible by parallel.tensor_model_parallel_size=2 x "
        "parallel.pipeline_model_parallel_size=1 = 2",
    ),
    (
        _set(parallel__data_parallel_size=3),
        {"world": 4},
        "parallel.data_parallel_size=3 = 3 must equal the world size 4; set parallel.data_parallel_size=4 or",
    ),
    (  # 5 x 8 = 40 rows; global 10 divides them, but not micro 1 x dp 4
        _set(parallel__global_batch_size=10, data__prompts_per_step=5),
        {"world": 4},
        "parallel.global_batch_size=10 must be divisible by parallel.micro_batch_size=1 (derived) x data "
        "parallel size 4",
    ),
    (  # derived global batch: 64 rows over dp 3
        _set(),
        {"world": 3},
        "the rows per step (data.prompts_per_step x generation.n_samples = 64, the global batch) must be "
        "divisible by parallel.micro_batch_size=1 (derived) x data parallel size 3",
    ),
    (
        _set(parallel__global_batch_size=48),
        {},
        "parallel.global_batch_size=48 must divide the rows per step",
    ),
    (
        _set(parallel__global_batch_size=32, algorithm__mini_batch_size=16),
        {},
        "parallel.global_batch_size=32 disagrees with algorithm.mini_batch_size=16",
    ),
    (
        _set(parallel__sequence_parallel=True),
        {},
        "parallel.sequence_parallel=true needs parallel.tensor_model_parallel_size > 1 (got 1)",
    ),
    (
        _set(parallel__backend="nccl", trainer__device="auto"),
        {"cuda": False},
        "parallel.backend=nccl needs CUDA (no CUDA device); use parallel.backend=gloo or auto",
    ),
    (_set(parallel__backend="mpi"), {}, "parallel.backend='mpi' is not one of: auto, nccl, gloo"),
    (_set(parallel__use_te="maybe"), {}, "parallel.use_te='maybe' is not one of: auto, true, false"),
    (_set(parallel__tensor_model_parallel_size=0), {}, "parallel.tensor_model_parallel_size=0 must be >= 1"),
    (_set(parallel__data_parallel_size=-1), {}, "parallel.data_parallel_size=-1 must be >= 0"),
    (_set(parallel__micro_batch_size=-1), {}, "parallel.micro_batch_size=-1 must be >= 0 (0 = derived)"),
]


@pytest.mark.parametrize(("change", "args", "expected"), BAD)
def test_bad_layout_is_one_line(change, args, expected):
    cfg = _cfg()
    change(cfg)
    with pytest.raises(ConfigError) as info:
        _layout(cfg, **args)
    message = str(info.value)
    assert "\n" not in message
    assert expected in message


# --- through the CLI -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recipe", "tp", "pp", "dp"),
    [
        ("tp1pp1", 1, 1, 0),
        ("tp2pp1", 2, 1, 0),
        ("tp3pp1", 3, 1, 0),
        ("tp1pp2", 1, 2, 0),
        ("tp2pp2", 2, 2, 0),
        ("dp2", 1, 1, 2),
    ],
)
def test_recipes_compose(capsys, recipe, tp, pp, dp):
    # tp/pp need the megatron backend; the tiny model's 4 heads / 2 KV heads become 6 / 3 for tp3
    heads = ["model.tiny.num_heads=6", "model.tiny.num_kv_heads=3", "model.tiny.hidden_size=192"]
    model = (["model=megatron"] + (heads if tp == 3 else [])) if tp * pp > 1 else []
    assert main(["show-config", *model, f"parallel={recipe}"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"  tensor_model_parallel_size: {tp}\n  pipeline_model_parallel_size: {pp}\n" in out
    assert f"  data_parallel_size: {dp}\n" in out


@pytest.mark.parametrize("recipe", ["tp2pp1", "tp1pp2"])
def test_a_model_parallel_layout_on_the_hf_backend_is_one_line(capsys, recipe):
    """The hf backend shards nothing: a tp/pp layout there would train silently unparallel."""
    assert main(["train", f"parallel={recipe}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs model=megatron" in err and "torchrun" in err


def test_default_recipe_is_tp1pp1():
    p = load_config([]).parallel
    assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.data_parallel_size) == (1, 1, 0)


def test_recipe_resolves_with_validate_parallel():
    cfg = load_config(
        ["model=megatron", "parallel=tp2pp2", "data.prompts_per_step=4", "generation.n_samples=4"]
    )
    # 8 processes / (2 x 2) = dp 2; 4 x 4 = 16 rows, 8 per rank; derived micro-batch 4 (>= pp 2
    # micro-batches per rank), so 16 / (4 x 2) = 2 micro-batches
    got = _layout(cfg, world=8, cuda=False)
    assert (got.tp, got.pp, got.dp, got.global_batch_size, got.num_micro_batches) == (2, 2, 2, 16, 2)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["parallel.tensor_model_parallel_size=0"], "parallel.tensor_model_parallel_size=0 must be >= 1"),
        (["parallel.sequence_parallel=true"], "parallel.sequence_parallel=true needs"),
        (["parallel.backend=mpi"], "parallel.backend='mpi' is not one of"),
        (["parallel=tp9"], "Could not find 'parallel/tp9'"),
        (["parallel.nope=1"], "unknown config key 'parallel.nope': no such key"),
        (["model.backend=nope"], "model.backend='nope' is unknown; known: hf, megatron"),
    ],
)
def test_bad_parallel_config_fails_at_start(capsys, overrides, expected):
    assert expected in cli_error(capsys, *overrides)


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core not installed")
def test_megatron_model_validates_when_importable(capsys):
    assert main(["show-config", "model=megatron", "parallel=tp2pp2"]) == 0
    assert "  backend: megatron\n  path: tiny\n" in capsys.readouterr().out


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core not installed")
def test_megatron_checks_the_tiny_model_shape_at_start(capsys):
    line = cli_error(capsys, "model=megatron", "parallel.tensor_model_parallel_size=3")
    assert line.endswith(
        "parallel.tensor_model_parallel_size=3 must divide the model's 4 attention heads; try 1, 2 or 4"
    )


@pytest.mark.skipif(not HAS_MEGATRON, reason="megatron-core not installed")
def test_tp3_recipe_needs_heads_that_three_divides(capsys):
    line = cli_error(capsys, "model=megatron", "parallel=tp3pp1")  # the tiny model's 4 heads
    assert line.endswith(
        "parallel.tensor_model_parallel_size=3 must divide the model's 4 attention heads; try 1, 2 or 4"
    )
    gqa = ["model.tiny.num_heads=9", "model.tiny.num_kv_heads=3", "model.tiny.hidden_size=72"]
    assert main(["show-config", "model=megatron", "parallel=tp3pp1", *gqa]) == 0
    assert "  tensor_model_parallel_size: 3\n" in capsys.readouterr().out


def test_megatron_model_without_megatron_core_is_one_line(capsys, monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name.split(".")[0] == "megatron" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert cli_error(capsys, "model=megatron") == f"nemo-azr: error: {MEGATRON_MISSING}"
