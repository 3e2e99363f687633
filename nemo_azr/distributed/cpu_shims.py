"""Shims that let megatron-core 0.16 run on CPU (gloo); every one is a no-op when CUDA is available.

megatron-core assumes a GPU in a handful of places. Each shim below replaces only a spot that would
otherwise crash without CUDA, so behaviour of code that already works is unchanged:

* RNG: :class:`CpuRNGStatesTracker` stands in for ``tensor_parallel.random.CudaRNGStatesTracker``
  (it forks the CPU generator instead of the CUDA one) and :func:`cpu_model_parallel_manual_seed`
  replaces ``model_parallel_cuda_manual_seed``.
* ``torch.cuda.current_device()`` used as a device, ``device="cuda"`` literals and
  ``torch.cuda.synchronize()``: the listed megatron modules see a :class:`_CpuTorch` proxy as their
  ``torch`` global, which answers those with the CPU (a no-op for the sync) and forwards everything
  else to the real ``torch``.
* ``Tensor.cuda()`` / ``Tensor.type() == 'torch.cuda.FloatTensor'``: patched only while the named
  megatron function runs (:func:`_during`).

:func:`apply_cpu_shims` applies them all once (idempotent).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from megatron.core.tensor_parallel import random as mrandom

__all__ = ["CpuRNGStatesTracker", "apply_cpu_shims", "cpu_model_parallel_manual_seed", "shims_applied"]

_APPLIED = False
_CPU = torch.device("cpu")

# megatron.core module -> the functions in it that use torch.cuda.current_device() or device="cuda".
_REMAPPED_MODULES: dict[str, str] = {
    "megatron.core.models.common.embeddings.rotary_pos_embedding": "RotaryEmbedding.get_emb moves "
    "inv_freq to torch.cuda.current_device()",
    "megatron.core.transformer.utils": "get_default_causal_mask / get_sliding_window_causal_mask "
    "build the mask on device='cuda'",
    "megatron.core.inference.communication_utils": "send_to_next_pipeline_rank / "
    "recv_from_prev_pipeline_rank_ (generation.backend=megatron with pp > 1) call torch.cuda.synchronize()",
    "megatron.core.inference.model_inference_wrappers.abstract_model_inference_wrapper": "_allocate_recv_buffer "
    "allocates the pipeline receive buffer on torch.cuda.current_device()",
    "megatron.core.transformer.attention": "Attention._allocate_memory puts the KV cache of megatron's "
    "inference context (generation.backend=megatron) on torch.cuda.current_device()",
    "megatron.core.utils": "GlobalMemoryBuffer.get_tensor (attention-score buffer) allocates on "
    "torch.cuda.current_device()",
    "megatron.core.pipeline_parallel.schedules": "forward_backward_* allocate total_num_tokens on "
    "device='cuda'",
    "megatron.core.pipeline_parallel.p2p_communication": "P2PCommunicator._communicate(_shapes) "
    "allocates receive buffers on torch.cuda.current_device() and calls torch.cuda.synchronize() "
    "after batched isend/irecv (batch_p2p_sync)",
    "megatron.core.tensor_parallel.mappings": "_gather_along_first_dim / _reduce_scatter_along_first_dim "
    "allocate outputs on torch.cuda.current_device()",
    "megatron.core.tensor_parallel.layers": "LinearWithGradAccumulationAndAsyncCommunication "
    "(sequence parallel) allocates buffers on torch.cuda.current_device()",
    "megatron.core.tensor_parallel.utils": "gather_split_1d_tensor allocates on torch.cuda.current_device()",
    "megatron.core.tensor_parallel.data": "broadcast_data allocates on device='cuda'",
    "megatron.core.distributed.param_and_grad_buffer": "_ParamAndGradBuffer allocates param/grad "
    "buffers on torch.cuda.current_device()",
    "megatron.core.optimizer.clip_grads": "get_grad_norm_fp32 / clip_grad_by_total_norm_fp32 / "
    "count_zeros_fp32 allocate norm buffers on device='cuda'",
    "megatron.core.optimizer.optimizer": "MixedPrecisionOptimizer / FP32Optimizer allocate found_inf "
    "and scale buffers on device='cuda'",
    "megatron.core.optimizer.distrib_optimizer": "DistributedOptimizer allocates shard buffers on "
    "torch.cuda.current_device()",
    "megatron.core.optimizer.grad_scaler": "ConstantGradScaler / DynamicGradScaler keep the scale on "
    "device='cuda'",
    "megatron.core.dist_checkpointing.strategies.filesystem_async": "FileSystemWriterAsync."
    "preload_tensors calls torch.cuda.synchronize() after its host copies (every torch_dist save)",
    "megatron.core.dist_checkpointing.strategies.state_dict_saver": "save_state_dict_async_plan / "
    "_finalize all-reduce their flags on device='cuda' / torch.cuda.current_device()",
    "megatron.core.dist_checkpointing.strategies.async_utils": "TemporalAsyncCaller (trainer.async_save) "
    "calls torch.cuda.synchronize() and all-reduces its done flags on torch.cuda.current_device()",
}

# Tensor factories whose device="cuda" argument the proxy maps to the CPU.
_FACTORIES = ("empty", "zeros", "ones", "full", "tensor", "arange")


def _to_cpu_device(device: Any) -> Any:
    """``"cuda"``, ``"cuda:N"``, ``torch.device("cuda")`` -> the CPU; anything else unchanged."""
    if isinstance(device, str) and device.startswith("cuda"):
        return _CPU
    if isinstance(device, torch.device) and device.type == "cuda":
        return _CPU
    return device


class _CpuCuda:
    """``torch.cuda`` whose ``current_device()`` is the CPU; every other attribute is the real one."""

    @staticmethod
    def current_device() -> torch.device:
        return _CPU

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """CPU kernels are synchronous: nothing to wait for."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)


class _CpuTorch:
    """``torch`` for one megatron module: CUDA device requests become CPU ones, the rest is torch."""

    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _cpu_factory(factory: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    @functools.wraps(factory)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        return factory(*args, **kwargs)

    return wrapper


for _name in _FACTORIES:
    setattr(_CpuTorch, _name, staticmethod(_cpu_factory(getattr(torch, _name))))


@contextlib.contextmanager
def _tensor_methods(**methods: Callable[..., Any]) -> Iterator[None]:
    """Temporarily replace ``torch.Tensor`` methods (restored on exit, even on error)."""
    saved = {name: getattr(torch.Tensor, name) for name in methods}
    for name, method in methods.items():
        setattr(torch.Tensor, name, method)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def _not_none(tensor: torch.Tensor | None) -> None:
    assert tensor is not None


def _cuda_identity(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return self  # Tensor.cuda() on CPU: stay where we are


_ORIG_TYPE = torch.Tensor.type


def _cuda_type_name(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    # Tensor.type() with no argument returns a name; report CPU tensors under their CUDA name.
    name = _ORIG_TYPE(self, *args, **kwargs)
    if not args and not kwargs and self.device.type == "cpu" and name.startswith("torch."):
        return "torch.cuda." + name[len("torch.") :]
    return name


def _during(owner: Any, attr: str, **methods: Callable[..., Any]) -> None:
    """Wrap ``owner.attr`` so that ``methods`` replace the ``torch.Tensor`` methods while it runs."""
    raw = vars(owner)[attr]  # the raw descriptor: a classmethod/staticmethod must stay one
    kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
    original = raw.__func__ if kind else raw

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with _tensor_methods(**methods):
            return original(*args, **kwargs)

    setattr(owner, attr, kind(wrapper) if kind else wrapper)


class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
    """Named states of the CPU generator with ``CudaRNGStatesTracker``'s interface (a subclass, so
    megatron's ``isinstance`` checks pass): ``fork(name)`` swaps the CPU generator to that state."""

    def __init__(self, use_cudagraphable_rng: bool = False, is_inference_rng_tracker: bool = False) -> None:
        super().__init__(use_cudagraphable_rng=False, is_inference_rng_tracker=is_inference_rng_tracker)

    def add(self, name: str, seed: int) -> None:
        """Track a new state ``name`` seeded with ``seed`` (the current CPU state is left alone)."""
        self._is_initialized = True
        if seed in self.seeds_:
            raise Exception(f"seed {seed} already exists")
        if name in self.states_:
            raise Exception(f"rng state {name} already exists")
        self.seeds_.add(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()

    @contextlib.contextmanager
    def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
        """Run the block on the CPU generator state ``name``, then restore the outer state."""
        if name not in self.states_:
            raise Exception(f"rng state {name} is not added")
        outer = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)


def cpu_model_parallel_manual_seed(seed: int) -> None:
    """CPU version of ``tensor_parallel.random.model_parallel_cuda_manual_seed``: same three states.

    The default generator gets ``seed`` (data parallel); the tracker holds the tensor-parallel state
    ``seed + 2718 + tp_rank`` and the expert state, as megatron derives them.
    """
    from megatron.core import parallel_state

    apply_cpu_shims()
    mrandom.initialize_rng_tracker(force_reset=True)
    tracker = mrandom.get_cuda_rng_tracker()
    tracker.reset()
    torch.manual_seed(seed)
    tracker.add(mrandom._DATA_PARALLEL_RNG_TRACKER_NAME, seed)
    tracker.add(
        mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME,
        seed + 2718 + parallel_state.get_tensor_model_parallel_rank(),
    )
    expert_seed = (
        seed
        + 1024
        + 100 * parallel_state.get_expert_model_parallel_rank()
        + parallel_state.get_expert_tensor_parallel_rank()
    )
    tracker.add(mrandom._EXPERT_PARALLEL_RNG_TRACKER_NAME, expert_seed)


def shims_applied() -> bool:
    """Whether :func:`apply_cpu_shims` has patched megatron-core in this process."""
    return _APPLIED


def apply_cpu_shims() -> None:
    """Patch megatron-core for CPU once; does nothing when CUDA is available or already applied."""
    global _APPLIED
    if _APPLIED or torch.cuda.is_available():
        return
    # tensor_parallel.random.CudaRNGStatesTracker: initialize_rng_tracker() instantiates this global,
    # which saves/restores CUDA generator states; the CPU subclass forks the CPU generator instead.
    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    mrandom.initialize_rng_tracker(force_reset=True)

    # See _REMAPPED_MODULES for the function(s) of each module that need a CPU device.
    proxy = _CpuTorch()
    for module_name in _REMAPPED_MODULES:
        importlib.import_module(module_name).torch = proxy

    # LanguageModule.setup_embeddings_and_output_layer: `weight.data = weight.data.cuda()` before the
    # all-reduce of tied embeddings between the first and last pipeline stage.
    from megatron.core.models.common.language_module.language_module import LanguageModule

    _during(LanguageModule, "setup_embeddings_and_output_layer", cuda=_cuda_identity)

    # Optimizers accept only params whose type() is 'torch.cuda.{Float,Half,BFloat16}Tensor':
    # Float16OptimizerWithFloat16Params.__init__, DistributedOptimizer._build_model_and_main_param_groups
    # and clip_grads.clip_grad_by_total_norm_fp32 (also bound by name in optimizer.optimizer).
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as moptimizer

    _during(moptimizer.Float16OptimizerWithFloat16Params, "__init__", type=_cuda_type_name)
    _during(
        distrib_optimizer.DistributedOptimizer,
        "_build_model_and_main_param_groups",
        type=_cuda_type_name,
    )
    _during(clip_grads, "clip_grad_by_total_norm_fp32", type=_cuda_type_name)
    # DistributedOptimizer.get_parameter_state_dp_zero (the reshardable checkpoint of
    # parallel.distributed_optimizer) moves each shard to the GPU with `.cuda()` before gathering it.
    _during(distrib_optimizer.DistributedOptimizer, "get_parameter_state_dp_zero", cuda=_cuda_identity)
    # inference.communication_utils._is_cuda asserts that pipeline send/receive tensors are on CUDA.
    from megatron.core.inference import communication_utils

    communication_utils._is_cuda = _not_none
    moptimizer.clip_grad_by_total_norm_fp32 = clip_grads.clip_grad_by_total_norm_fp32
    _APPLIED = True
