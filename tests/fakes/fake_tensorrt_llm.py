"""FAKE TensorRT-LLM for tests: an in-process CPU stand-in for the part of the LLM API the ``trtllm``
generation backend uses. Never a backend for users: it lives under tests/, is not packaged, and the
backend only ever imports the module named ``tensorrt_llm``; tests put this one there with
:func:`install` (``sys.modules``, undone by monkeypatch).

It is as strict as the release it imitates (``install(monkeypatch, release="1.2")``), whose row of
``nemo_azr.rollout.trtllm_api.RELEASES`` it reads, so the contract suite fails where the real library
would:

* ``LLM(**kwargs)``: any keyword outside the release's ``llm_keywords`` is refused (the real args
  model refuses unknown fields); ``load_format="dummy"`` starts from random weights, so nothing works
  until the first refit.
* Log-probs: ``sampler_type="TRTLLMSampler"`` returns the sampled token's log-prob under the
  temperature-scaled distribution; the default sampler (``auto`` / ``TorchSampler``) returns the
  top-``logprobs`` tokens of the *raw* logits (no temperature), which need not include the sampled
  token, as TensorRT-LLM 1.2's TorchSampler does.
* Seeds: a release without per-request seeds samples every request from one engine-wide generator
  seeded at start; ``SamplingParams.seed`` is ignored.
* Greedy (``top_k=1``) with ``n > 1`` is refused where the release refuses it.
* ``update_weights`` unpickles with an allowlist (builtins and torch only, as the library's
  restricted unpickler); handles of CUDA tensors get their device index (args[6]) replaced.
* Tensor parallelism: each TP rank holds only its shard of every weight (column-parallel layers and
  the embedding split on dim 0, ``o_proj``/``down_proj`` on dim 1, norms replicated), loaded by
  slicing the full tensors it receives, as the engine's loader does; generation all-gathers the
  shards. Per-rank checksums are therefore of shards.
* ``sleep(tags)`` / ``wakeup(tags)``: released weights are lost until wakeup (filled with NaN here),
  and generating or loading weights into released memory is an error.

Generation decodes with the HF model built from the folder's config on CPU (KV-cached, one sample at
a time); ``end_id`` (excluded from the output; ``-1`` = none), ``stop_token_ids`` and token-level
``stop`` strings end a sample.
"""

from __future__ import annotations

import base64
import copy
import importlib
import inspect
import io
import pickle
import sys
import types
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from nemo_azr.rollout.trtllm_api import RELEASES, ReleaseSurface

IS_FAKE = True
#: The release this fake imitates (``install`` sets it from the table).
SURFACE: ReleaseSurface = RELEASES["1.2"]
__version__ = SURFACE.pinned
SLEEP_TAGS = (
    "sampler",
    "drafter",
    "guided_decoder",
    "spec_resource_manager",
    "model_extra",
    "executor_extra",
    "model",
    "draft_model",
    "kv_cache",
)
SAMPLERS = ("auto", "TorchSampler", "TRTLLMSampler")
#: Module-name prefixes update_weights may unpickle from (the library's restricted unpickler).
UNPICKLE_ALLOWED = ("builtins", "torch")
#: Parameters split on dim 1 across TP ranks (row-parallel); other 2-D ones on dim 0, 1-D replicated.
ROW_PARALLEL = ("o_proj", "down_proj")


def get_device_uuid(device_id: int) -> str:
    return f"FAKE-GPU-{device_id}"


@dataclass(slots=True, kw_only=True)
class SamplingParams:
    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    n: int = 1
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    logprobs: int | None = None
    ignore_eos: bool = False
    detokenize: bool = True


@dataclass(kw_only=True)
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True


class Logprob(NamedTuple):
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


class _AllowlistUnpickler(pickle.Unpickler):
    """Only builtins and torch may be named in an update_weights payload."""

    def find_class(self, module: str, name: str) -> Any:
        if module.split(".")[0] not in UNPICKLE_ALLOWED:
            raise pickle.UnpicklingError(f"refused: {module}.{name} (only builtins and torch are allowed)")
        return super().find_class(module, name)


def shard_dim(name: str, param: torch.Tensor, tp: int) -> int | None:
    """The dim a TP rank's shard of ``name`` is cut on (None: replicated on every rank)."""
    if tp == 1:
        return None
    if param.dim() == 2:
        dim = 1 if any(f".{r}." in f".{name}" for r in ROW_PARALLEL) else 0
    elif param.dim() == 1 and not any(f".{r}." in f".{name}" for r in ROW_PARALLEL) and "norm" not in name:
        dim = 0  # a column-parallel bias
    else:
        return None
    return dim if param.shape[dim] % tp == 0 else None


class ModelLoader:
    """``model_loader.reload(model, weights, allow_partial_loading)``: copy by HF parameter name, each
    TP rank keeping only its shard of the full tensor it receives."""

    def __init__(self, rank: int = 0, tp: int = 1) -> None:
        self.rank, self.tp = rank, tp

    def reload(
        self, model: torch.nn.Module, weights: dict[str, torch.Tensor], allow_partial_loading: bool
    ) -> None:
        params = dict(model.named_parameters())
        if not allow_partial_loading and set(params) - set(weights):
            raise ValueError(f"missing weights: {sorted(set(params) - set(weights))[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                if name not in params:  # unknown names: ignored under partial loading
                    continue
                dim = shard_dim(name, tensor, self.tp)
                part = tensor if dim is None else tensor.chunk(self.tp, dim)[self.rank]
                params[name].copy_(part.to(params[name].dtype))


class _ModelEngine:
    def __init__(self, model: torch.nn.Module, rank: int = 0, tp: int = 1) -> None:
        self.model = model
        self.model_loader = ModelLoader(rank, tp)


class _Engine:
    def __init__(self, model: torch.nn.Module, rank: int = 0, tp: int = 1) -> None:
        self.model_engine = _ModelEngine(model, rank, tp)
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self) -> None:
        self.prefix_cache_resets += 1


def rebuild_handles(handles: str | list, device_id: int) -> dict[str, torch.Tensor]:
    """The tensors of one rank's update_weights payload (base64 pickle or the plain list)."""
    if isinstance(handles, str):
        handles = _AllowlistUnpickler(io.BytesIO(base64.b64decode(handles))).load()
        if not isinstance(handles, list):
            raise ValueError(f"Deserialized data must be a list, got {type(handles).__name__}")
    weights = {}
    for name, (func, args) in handles:
        args = list(args)
        if len(args) > 6:  # a CUDA IPC handle: rebuilt on this worker's device
            args[6] = device_id
        weights[name] = func(*args)
    return weights


class WorkerExtension:
    """Fake of ``tensorrt_llm.llmapi.rlhf_utils.WorkerExtension``: ``self.engine`` / ``self.device_id``
    are the worker's (set by the fake LLM)."""

    def update_weights(self, ipc_handles: dict | None = None) -> None:
        if self.asleep & {"model"}:
            raise RuntimeError("update_weights into released weight memory: wake the engine first")
        self.log.append(("update_weights", None if ipc_handles is None else len(ipc_handles)))
        if ipc_handles is None:
            self.finalized += 1
            self.engine.reset_prefix_cache()
            return
        uuid = get_device_uuid(self.device_id)
        if uuid not in ipc_handles:
            raise ValueError(f"Device UUID {uuid} not found in ipc_handles")
        weights = rebuild_handles(ipc_handles[uuid], self.device_id)
        self.bucket_bytes.append(sum(t.numel() * t.element_size() for t in weights.values()))
        self.engine.model_engine.model_loader.reload(
            self.engine.model_engine.model, weights, allow_partial_loading=True
        )


class _WorkerBase:
    def __init__(
        self, model: torch.nn.Module, device_id: int, enable_sleep: bool, rank: int = 0, tp: int = 1
    ) -> None:
        self.engine = _Engine(model, rank, tp)
        self.device_id = device_id
        self.rank, self.tp = rank, tp
        self.enable_sleep = enable_sleep
        self.asleep: set[str] = set()
        self.log: list[tuple[str, Any]] = []
        self.bucket_bytes: list[int] = []
        self.finalized = 0
        self._backup: dict[str, torch.Tensor] = {}

    def sleep(self, tags: list[str]) -> None:
        self._check_tags(tags)
        self.log.append(("sleep", tuple(tags)))
        if "model" in tags and "model" not in self.asleep:
            with torch.no_grad():  # released: the values are gone until wakeup restores them
                for name, p in self.engine.model_engine.model.named_parameters():
                    self._backup[name] = p.detach().clone()
                    p.fill_(float("nan"))
        self.asleep |= set(tags)

    def wakeup(self, tags: list[str]) -> None:
        self._check_tags(tags)
        self.log.append(("wakeup", tuple(tags)))
        if "model" in tags and "model" in self.asleep:
            with torch.no_grad():
                for name, p in self.engine.model_engine.model.named_parameters():
                    p.copy_(self._backup.pop(name))
        self.asleep -= set(tags)

    def _check_tags(self, tags: list[str]) -> None:
        if not self.enable_sleep:
            raise RuntimeError("sleep/wakeup need LLM(enable_sleep=True)")
        unknown = set(tags) - set(SLEEP_TAGS)
        if unknown:
            raise ValueError(f"unknown sleep tags {sorted(unknown)}")


def _import_path(path: str) -> type:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def sharded_copy(net: torch.nn.Module, rank: int, tp: int) -> torch.nn.Module:
    """``net`` with every parameter replaced by TP rank ``rank``'s shard (tied parameters stay tied)."""
    shard = copy.deepcopy(net)
    new: dict[int, torch.nn.Parameter] = {}
    for name, p in list(shard.named_parameters(remove_duplicate=False)):
        if id(p) not in new:
            dim = shard_dim(name, p, tp)
            data = p.detach() if dim is None else p.detach().chunk(tp, dim)[rank].clone()
            new[id(p)] = torch.nn.Parameter(data, requires_grad=False)
        module_path, _, leaf = name.rpartition(".")
        setattr(shard.get_submodule(module_path), leaf, new[id(p)])
    return shard


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - (SURFACE.llm_keywords - {"model"})
        if unknown:  # the real args model is strict: an unknown field is a validation error
            raise TypeError(
                f"LLM got unexpected keyword argument(s) {sorted(unknown)} (TensorRT-LLM {__version__} fake)"
            )
        backend = kwargs.get("backend", "pytorch")
        load_format = kwargs.get("load_format", "auto")
        tp = kwargs.get("tensor_parallel_size", 1)
        dtype = kwargs.get("dtype", "auto")
        sampler_type = kwargs.get("sampler_type", "auto")
        enable_sleep = bool(kwargs.get(SURFACE.sleep_keyword, False))
        if backend != "pytorch":
            raise ValueError(f"fake LLM: backend {backend!r}")
        if load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format {load_format!r}")
        if sampler_type not in SAMPLERS:
            raise ValueError(f"sampler_type {sampler_type!r} not in {SAMPLERS}")
        if kwargs.get("ray_worker_extension_cls") is not None and kwargs.get("orchestrator_type") != "ray":
            raise ValueError("ray_worker_extension_cls needs orchestrator_type='ray'")
        self.init_kwargs = dict(kwargs)
        self.sampler_type = sampler_type
        config = AutoConfig.from_pretrained(model)
        torch_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        torch_dtype = torch_dtype if dtype == "auto" else getattr(torch, dtype)
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.max_batch_size = kwargs.get("max_batch_size", 2048)
        self.max_seq_len = kwargs.get("max_seq_len") or config.max_position_embeddings
        # one engine-wide generator where the release ignores per-request seeds
        self.generator = torch.Generator().manual_seed(0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1000)
            if load_format == "dummy":
                self.net = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
            else:
                self.net = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
        ext_path = kwargs.get("ray_worker_extension_cls")
        ext = _import_path(ext_path) if ext_path else WorkerExtension
        worker_cls = type("FakeRayWorker", (ext, _WorkerBase), {})
        self.workers = [
            worker_cls(sharded_copy(self.net, rank, tp), rank, enable_sleep, rank=rank, tp=tp)
            for rank in range(tp)
        ]
        self.shut_down = False

    # --- collective RPC ------------------------------------------------------------------------
    def _collective_rpc(
        self, method: str, args: tuple = (), kwargs: dict | None = None, non_block: bool = False
    ) -> list[Any]:
        if method not in SURFACE.rpc_methods:
            raise AttributeError(f"the worker has no RPC method {method!r} (not in the release's table row)")
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]

    def shutdown(self) -> None:
        self.shut_down = True

    # --- generation ----------------------------------------------------------------------------
    @torch.no_grad()
    def _gather(self) -> torch.nn.Module:
        """The full model from the ranks' shards (the engine's all-gather)."""
        shards = [dict(w.engine.model_engine.model.named_parameters()) for w in self.workers]
        tp = len(self.workers)
        for name, p in self.net.named_parameters():
            dim = shard_dim(name, p, tp)
            full = shards[0][name] if dim is None else torch.cat([s[name] for s in shards], dim)
            p.copy_(full)
        return self.net

    def generate(
        self, inputs: list[list[int]], sampling_params: SamplingParams, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        worker = self.workers[0]
        if worker.asleep & {"model", "kv_cache"}:
            raise RuntimeError(f"generate on a sleeping engine (asleep: {sorted(worker.asleep)})")
        sp = sampling_params
        if sp.n > self.max_batch_size:
            raise ValueError(
                f"SamplingParams.n ({sp.n}) should not exceed max_batch_size ({self.max_batch_size})"
            )
        if sp.n > 1 and _is_greedy(sp) and not SURFACE.greedy_n_above_one:
            raise ValueError("Greedy decoding in the LLM API does not allow multiple returns (n > 1)")
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        worker.log.append(("generate", len(inputs)))
        model = self._gather()
        return [self._one(i, list(p), sp, model) for i, p in enumerate(inputs)]

    @torch.no_grad()
    def _one(self, rid: int, prompt: list[int], sp: SamplingParams, model: torch.nn.Module) -> RequestOutput:
        if len(prompt) + sp.max_tokens > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_tokens ({sp.max_tokens}) > max_seq_len ({self.max_seq_len})"
            )
        if SURFACE.per_request_seed and sp.seed is not None:
            gen = torch.Generator().manual_seed(sp.seed)
        else:
            gen = self.generator
        end_id = self.tokenizer.eos_token_id if sp.end_id is None else sp.end_id
        stop_ids = [self.tokenizer.encode(s, add_special_tokens=False) for s in _as_list(sp.stop)]
        temperature = 1.0 if sp.temperature is None else sp.temperature
        processed = self.sampler_type == "TRTLLMSampler"
        # transformers >= 5.x names the KV cache `cache` (in and out); earlier ones `past_key_values`
        cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        outputs = []
        for k in range(sp.n):
            toks, lps, reason = [], [], "length"
            step, past = torch.tensor([prompt]), None  # the prompt, then one new token per step (KV cache)
            for _ in range(sp.max_tokens):
                out = model(input_ids=step, use_cache=True, logits_to_keep=1, **{cache_kw: past})
                logits, past = out.logits[0, -1].float(), getattr(out, cache_kw)
                scaled = (logits / temperature).log_softmax(-1)
                tok = self._draw(scaled, sp, gen)
                entry = _logprob_entry(scaled if processed else logits.log_softmax(-1), tok, sp, processed)
                if tok == end_id and end_id != -1 and not sp.ignore_eos:
                    reason = "stop"
                    break
                step = torch.tensor([[tok]])
                toks.append(tok)
                lps.append(entry)
                if tok in (sp.stop_token_ids or []) or any(
                    ids and toks[-len(ids) :] == ids for ids in stop_ids
                ):
                    reason = "stop"
                    if not sp.include_stop_str_in_output:
                        toks, lps = _strip_stop(toks, lps, sp.stop_token_ids or [], stop_ids)
                    break
            text = self.tokenizer.decode(toks) if sp.detokenize else ""
            outputs.append(CompletionOutput(k, text, toks, lps if sp.logprobs else [], reason))
        return RequestOutput(rid, prompt, outputs)

    @staticmethod
    def _draw(logp: torch.Tensor, sp: SamplingParams, gen: torch.Generator) -> int:
        if _is_greedy(sp):
            return int(logp.argmax())
        keep = torch.ones_like(logp, dtype=torch.bool)
        if sp.top_k:
            keep &= logp >= torch.topk(logp, sp.top_k).values[-1]
        if sp.top_p is not None and sp.top_p < 1.0:
            sorted_lp, order = logp.sort(descending=True)
            before = sorted_lp.softmax(-1).cumsum(-1) - sorted_lp.softmax(-1)
            keep &= torch.zeros_like(keep).scatter(0, order, before < sp.top_p)
        probs = logp.masked_fill(~keep, float("-inf")).softmax(-1)
        return int(torch.multinomial(probs, 1, generator=gen))


def _is_greedy(sp: SamplingParams) -> bool:
    return sp.top_k == 1 or sp.temperature == 0


def _logprob_entry(logp: torch.Tensor, tok: int, sp: SamplingParams, processed: bool) -> dict[int, Logprob]:
    """TRTLLMSampler: the sampled token's log-prob; TorchSampler (1.2): the top-``logprobs`` tokens of
    the raw distribution only (the sampled token appears when it is among them)."""
    rank = int((logp > logp[tok]).sum()) + 1
    if processed:
        return {tok: Logprob(float(logp[tok]), rank)}
    top = torch.topk(logp, sp.logprobs or 1)
    return {int(t): Logprob(float(v), r + 1) for r, (v, t) in enumerate(zip(top.values, top.indices))}


def _as_list(stop: str | list[str] | None) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


def _strip_stop(toks: list[int], lps: list, stop_token_ids: list[int], stop_ids: list[list[int]]):
    if toks and toks[-1] in stop_token_ids:
        return toks[:-1], lps[:-1]
    for ids in stop_ids:
        if ids and toks[-len(ids) :] == ids:
            return toks[: -len(ids)], lps[: -len(ids)]
    return toks, lps


def install(monkeypatch, release: str = "1.2", surface: ReleaseSurface | None = None) -> types.ModuleType:
    """Put this fake in ``sys.modules`` as ``tensorrt_llm`` (and the submodules the backend and the
    worker extension import) for one test, imitating ``release`` (a row of ``RELEASES``), or
    ``surface``, a changed row that then stands in the table for the test (the backend reads it too);
    returns the fake ``tensorrt_llm`` module."""
    me = sys.modules[__name__]
    surface = surface or RELEASES[release]
    monkeypatch.setitem(RELEASES, surface.release, surface)  # the backend reads the same row
    monkeypatch.setattr(me, "SURFACE", surface)
    monkeypatch.setattr(me, "__version__", surface.pinned)
    root = types.ModuleType("tensorrt_llm")
    root.__dict__.update(
        LLM=LLM, SamplingParams=SamplingParams, __version__=surface.pinned, IS_FAKE=True, fake=me
    )
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    llmapi.__dict__.update(LLM=LLM, SamplingParams=SamplingParams, KvCacheConfig=KvCacheConfig)
    rlhf = types.ModuleType("tensorrt_llm.llmapi.rlhf_utils")
    rlhf.WorkerExtension = WorkerExtension
    torch_pkg = types.ModuleType("tensorrt_llm._torch")
    utils = types.ModuleType("tensorrt_llm._torch.utils")
    utils.get_device_uuid = get_device_uuid
    root.llmapi, llmapi.rlhf_utils, root._torch, torch_pkg.utils = llmapi, rlhf, torch_pkg, utils
    for name, mod in (
        ("tensorrt_llm", root),
        ("tensorrt_llm.llmapi", llmapi),
        ("tensorrt_llm.llmapi.rlhf_utils", rlhf),
        ("tensorrt_llm._torch", torch_pkg),
        ("tensorrt_llm._torch.utils", utils),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    # the worker extension module binds WorkerExtension at import: import it afresh under the fake
    monkeypatch.delitem(sys.modules, "nemo_azr.rollout.trtllm_worker", raising=False)
    return root
