"""Checks of the ``parallel`` group (Megatron-core backend), as pure functions.

Two stages: :func:`check_parallel_static` runs from ``validate_config`` at start (values that are wrong
whatever the machine), :func:`validate_parallel` runs once the world size and the model shape are
known and returns the resolved layout. The rules mirror megatron-core 0.16, so a bad layout fails
here with one line instead of an assert deep inside megatron on some ranks (or a hang).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from nemo_azr.config.batch_shape import rows_per_step
from nemo_azr.config.schema import NemoAzrConfig, ParallelConfig
from nemo_azr.errors import ConfigError

USE_TE_VALUES = ("auto", "true", "false")
DIST_BACKENDS = ("auto", "nccl", "gloo")
MEGATRON_MISSING = "model.backend=megatron needs megatron-core (pip install -e '.[megatron]')"

_TP = "parallel.tensor_model_parallel_size"
_PP = "parallel.pipeline_model_parallel_size"
_DP = "parallel.data_parallel_size"
_VPP = "parallel.virtual_pipeline_model_parallel_size"
_MBS = "parallel.micro_batch_size"
_GBS = "parallel.global_batch_size"


@dataclass(frozen=True)
class ResolvedLayout:
    """The layout one run uses: every 0 ("derived") of ``ParallelConfig`` replaced by its value."""

    tp: int
    pp: int
    dp: int
    micro_batch_size: int
    global_batch_size: int
    num_micro_batches: int  # per optimizer step and data-parallel rank
    vpp: int = 0  # virtual pipeline stages per rank; 0: no interleaving
    backend: str = "gloo"  # torch.distributed backend after resolving "auto"
    use_te: bool = False  # TransformerEngine layer spec after resolving "auto"


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def module_available(name: str) -> bool:
    """Whether ``name`` is importable, without importing it (a missing parent package counts as no)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # find_spec("a.b") imports "a" and raises when it is missing
        return False


def megatron_core_available() -> bool:
    return module_available("megatron.core")


def _or(values: list[int]) -> str:
    """``[1, 2, 4]`` -> ``"1, 2 or 4"`` (for "try ..." hints)."""
    words = [str(v) for v in values]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _use_te(p: ParallelConfig) -> str:
    # A command-line `parallel.use_te=true` reaches the str field as "True"; compare case-blind.
    return str(p.use_te).lower()


def check_parallel_static(cfg: NemoAzrConfig) -> None:
    """Value checks that need neither processes nor the model; run for every backend at start."""
    p = cfg.parallel
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
        _require(getattr(p, key) >= 1, f"parallel.{key}={getattr(p, key)} must be >= 1")
    for key, zero in (
        ("data_parallel_size", "derived from the world size"),
        ("micro_batch_size", "derived"),
        ("virtual_pipeline_model_parallel_size", "off"),
        ("global_batch_size", "derived"),
    ):
        _require(getattr(p, key) >= 0, f"parallel.{key}={getattr(p, key)} must be >= 0 (0 = {zero})")
    _require(
        p.timeout_s > 0,
        f"parallel.timeout_s={p.timeout_s} must be > 0 (seconds a collective waits for its peers)",
    )
    _require(
        p.make_vocab_size_divisible_by >= 1,
        f"parallel.make_vocab_size_divisible_by={p.make_vocab_size_divisible_by} must be >= 1",
    )
    # megatron/core/model_parallel_config.py:409-411 (ModelParallelConfig.__post_init__)
    _require(
        not p.sequence_parallel or p.tensor_model_parallel_size > 1,
        f"parallel.sequence_parallel=true needs {_TP} > 1 (got {p.tensor_model_parallel_size}); "
        "set parallel.sequence_parallel=false or use parallel=tp2pp1",
    )
    # megatron/core/parallel_state.py:745-749 (initialize_model_parallel)
    _require(
        not p.virtual_pipeline_model_parallel_size or p.pipeline_model_parallel_size > 1,
        f"{_VPP}={p.virtual_pipeline_model_parallel_size} (interleaved schedule) needs "
        f"{_PP} > 1 (got {p.pipeline_model_parallel_size}); set {_VPP}=0 (off)",
    )
    _require(
        _use_te(p) in USE_TE_VALUES,
        f"parallel.use_te={p.use_te!r} is not one of: {', '.join(USE_TE_VALUES)}",
    )
    _require(
        p.backend in DIST_BACKENDS,
        f"parallel.backend={p.backend!r} is not one of: {', '.join(DIST_BACKENDS)}",
    )


def check_parallel_for_megatron(cfg: NemoAzrConfig) -> None:
    """Checks that matter only when the Megatron backend reads ``parallel`` (still before any process)."""
    _check_megatron_common(cfg)
    if cfg.model.path == "tiny":  # the built-in model's shape is in the config: check it now
        t = cfg.model.tiny
        _check_model_shape(cfg.parallel, t.num_heads, t.num_kv_heads, t.num_layers)


def _check_megatron_common(cfg: NemoAzrConfig) -> None:
    p = cfg.parallel
    if cfg.trainer.device == "cpu":
        _check_device(p, cuda=False, why="trainer.device=cpu")
    _require(
        _use_te(p) != "true" or module_available("transformer_engine"),
        "parallel.use_te=true needs transformer-engine, which is not importable; use parallel.use_te=auto or false",
    )
    _check_batch_rows(cfg)


def validate_parallel(
    cfg: NemoAzrConfig,
    *,
    world_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    num_layers: int,
    cuda: bool | None = None,
) -> ResolvedLayout:
    """Check ``cfg.parallel`` against the processes and the model; return the resolved layout.

    ``num_key_value_heads`` 0 means as many as attention heads (megatron's ``num_query_groups=None``).
    ``cuda`` None: CUDA is used unless ``trainer.device=cpu`` and when torch sees a device.
    """
    check_parallel_static(cfg)
    _check_megatron_common(cfg)  # not the tiny-shape check: the real shape is given below
    p = cfg.parallel
    if cuda is None:
        import torch

        cuda = cfg.trainer.device != "cpu" and torch.cuda.is_available()
    _check_device(p, cuda=cuda, why="no CUDA device")
    _check_model_shape(p, num_attention_heads, num_key_value_heads, num_layers)

    tp, pp, vpp = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.virtual_pipeline_model_parallel_size,
    )
    _require(world_size >= 1, f"the world size must be >= 1 process, got {world_size}")
    model = tp * pp
    # megatron/core/parallel_state.py:738-743: world = tp x pp x dp (no context/expert parallelism here)
    if p.data_parallel_size:
        want = model * p.data_parallel_size
        hint = f"{_DP}={world_size // model} or " if world_size % model == 0 else ""
        _require(
            want == world_size,
            f"{_TP}={tp} x {_PP}={pp} x {_DP}={p.data_parallel_size} = {want} must equal the world size "
            f"{world_size}; set {hint}{_DP}=0 (derived)",
        )
        dp = p.data_parallel_size
    else:
        _require(
            world_size % model == 0,
            f"the world size {world_size} is not divisible by {_TP}={tp} x {_PP}={pp} = {model}; "
            f"run a multiple of {model} processes or choose tp x pp among {_or(_divisors(world_size))}",
        )
        dp = world_size // model

    mbs = p.micro_batch_size or _derived_micro_batch(cfg, dp, pp, interleaved=bool(vpp))
    mbs_desc = f"{_MBS}={mbs}" + ("" if p.micro_batch_size else " (derived)")
    gbs, gbs_desc = _global_batch(cfg, mbs * dp)
    # megatron/core/num_microbatches_calculator.py:340-350 (ConstantNumMicroBatchesCalculator)
    _require(
        gbs % (mbs * dp) == 0,
        f"{gbs_desc} must be divisible by {mbs_desc} x data parallel size {dp} = {mbs * dp}; "
        f"use a multiple of {mbs * dp}" + (f" or a {_MBS} dividing {gbs // dp}" if gbs % dp == 0 else ""),
    )
    num_micro = gbs // (mbs * dp)
    if vpp:
        # megatron/core/pipeline_parallel/schedules.py:995-1015 with microbatch_group_size_per_vp_stage
        # = pp (model_parallel_config.py:447-448): M >= pp and no remainder 0 < M % pp < pp, i.e. M % pp == 0.
        _require(
            num_micro % pp == 0,
            f"{_VPP}={vpp} (interleaved schedule) needs the micro-batches per step ({gbs_desc} / "
            f"({mbs_desc} x dp {dp}) = {num_micro}) to be a multiple of {_PP}={pp}; "
            f"use a global batch that is a multiple of {mbs * dp * pp} or {_VPP}=0",
        )

    backend = p.backend if p.backend != "auto" else ("nccl" if cuda else "gloo")
    use_te = _use_te(p) == "true" or (
        _use_te(p) == "auto" and cuda and module_available("transformer_engine")
    )
    return ResolvedLayout(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch_size=mbs,
        global_batch_size=gbs,
        num_micro_batches=num_micro,
        vpp=vpp,
        backend=backend,
        use_te=use_te,
    )


def _check_device(p: ParallelConfig, *, cuda: bool, why: str) -> None:
    """Features megatron-core runs only on CUDA (nccl; CUDA buffers; TE kernels)."""
    if cuda:
        return
    _require(
        p.backend != "nccl", f"parallel.backend=nccl needs CUDA ({why}); use parallel.backend=gloo or auto"
    )
    _require(
        _use_te(p) != "true",
        f"parallel.use_te=true needs CUDA ({why}); use parallel.use_te=auto or false",
    )


def _check_model_shape(p: ParallelConfig, heads: int, kv_heads: int, layers: int) -> None:
    _require(heads >= 1 and layers >= 1, f"the model has {heads} attention heads and {layers} layers")
    tp, pp, vpp = (
        p.tensor_model_parallel_size,
        p.pipeline_model_parallel_size,
        p.virtual_pipeline_model_parallel_size,
    )
    kv = kv_heads or heads  # megatron: num_query_groups None -> num_attention_heads
    good_tp = [t for t in _divisors(heads) if kv % t == 0 or t % kv == 0]
    # megatron/core/transformer/transformer_config.py:924-928
    _require(
        heads % tp == 0,
        f"{_TP}={tp} must divide the model's {heads} attention heads; try {_or(good_tp)}",
    )
    # megatron/core/transformer/transformer_config.py:939-946: a multiple OR a divisor
    _require(
        kv % tp == 0 or tp % kv == 0,
        f"{_TP}={tp} must divide or be a multiple of the model's {kv} key/value heads; try {_or(good_tp)}",
    )
    # megatron/core/transformer/transformer_block.py:155-158 (no embedding/loss in the pipeline split)
    _require(
        layers % pp == 0,
        f"{_PP}={pp} must divide the model's {layers} layers; try {_or(_divisors(layers))}",
    )
    # megatron/core/transformer/transformer_block.py:160-178: layers per pipeline rank divisible by vpp
    if vpp and pp > 1:
        _require(
            (layers // pp) % vpp == 0,
            f"{_VPP}={vpp} x {_PP}={pp} = {vpp * pp} must divide the model's {layers} layers; "
            f"try {_VPP}={_or(_divisors(layers // pp))}, or 0 (off)",
        )


def _derived_micro_batch(cfg: NemoAzrConfig, dp: int, pp: int, *, interleaved: bool) -> int:
    """``parallel.micro_batch_size=0``: the largest divisor of each data-parallel rank's rows per
    optimizer step that is at most ``algorithm.micro_batch_size`` and, with pipeline parallelism,
    leaves at least ``pp`` micro-batches (a multiple of ``pp`` when interleaved) so stages overlap.
    1 when no such divisor exists (the batch checks then name the problem)."""
    cap = max(1, cfg.algorithm.micro_batch_size)
    gbs, _ = _global_batch(cfg, cap * dp)
    if gbs % dp:
        return 1
    rows = gbs // dp
    fits = [
        d
        for d in _divisors(rows)
        if d <= cap and (pp == 1 or rows // d >= pp) and not (interleaved and (rows // d) % pp)
    ]
    return max(fits, default=1)


def _global_batch(cfg: NemoAzrConfig, per_micro_step: int) -> tuple[int, str]:
    """Rows per optimizer step, and how to name it in a message."""
    p, alg = cfg.parallel, cfg.algorithm
    if p.global_batch_size:
        return p.global_batch_size, f"{_GBS}={p.global_batch_size}"
    if alg.mini_batch_size:
        return alg.mini_batch_size, f"algorithm.mini_batch_size={alg.mini_batch_size} (the global batch)"
    if cfg.rollout.workflow == "azr":  # self-play batches vary; the backend splits each as it comes
        return per_micro_step, f"{_GBS} (derived: one micro-batch per rank, {per_micro_step})"
    rows, desc = rows_per_step(cfg)
    return rows, f"the rows per step ({desc} = {rows}, the global batch)"


def _check_batch_rows(cfg: NemoAzrConfig) -> None:
    """An explicit global batch is the optimizer-step size, so it must agree with the RL batch."""
    gbs, mini = cfg.parallel.global_batch_size, cfg.algorithm.mini_batch_size
    if not gbs:
        return
    _require(
        not mini or mini == gbs,
        f"{_GBS}={gbs} disagrees with algorithm.mini_batch_size={mini} (both are rows per optimizer "
        f"step); set one of them and leave the other 0",
    )
    if cfg.rollout.workflow == "azr":  # self-play batches vary in size
        return
    rows, desc = rows_per_step(cfg)
    _require(rows % gbs == 0, f"{_GBS}={gbs} must divide the rows per step ({desc} = {rows})")
