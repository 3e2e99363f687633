"""FAKE TensorRT-LLM for tests: an in-process CPU stand-in for the part of the LLM API the ``trtllm``
generation backend uses. Never a backend for users: it lives under tests/, is not packaged, and the
backend only ever imports the module named ``tensorrt_llm``; tests put this one there with
:func:`install` (``sys.modules``, undone by monkeypatch).

What it reproduces, from TensorRT-LLM's LLM API (PyTorch backend) and its RLHF worker extension:

* ``LLM(model=folder, load_format="dummy", ...)``: unknown keyword arguments are refused; ``dummy``
  starts from random weights, so nothing works until the first refit.
* ``LLM.generate(list of prompt token id lists, SamplingParams)`` -> ``RequestOutput`` objects with
  ``.outputs[i].token_ids`` and ``.logprobs`` (one ``{token_id: Logprob(logprob, rank)}`` per token,
  holding the top-``logprobs`` tokens first and the sampled one, as the engine returns them), ``n``
  samples, ``max_tokens``, ``end_id`` (excluded from the output; ``-1`` = none), ``stop_token_ids``,
  token-level ``stop`` strings (the generated ids end with the stop string's ids), ``seed``.
  Log-probs are of the temperature-scaled distribution before top-k/top-p.
* ``LLM._collective_rpc(method, args)``: one result per worker (TP rank), the method looked up on
  the worker extension class given as ``ray_worker_extension_cls`` (a dotted path).
* ``rlhf_utils.WorkerExtension.update_weights(ipc_handles)``: ``{device_uuid: handles}`` where handles
  is a base64 pickled list of ``(name, (rebuild_fn, args))`` (unpickled with a restricted
  unpickler that refuses byte-serialised storages) or that list itself; CUDA handles get their device
  index (args[6]) replaced; the weights are loaded by HF name with partial loading (unknown names
  are silently ignored, as a partial reload does); ``None`` finalises.
* ``sleep(tags)`` / ``wakeup(tags)`` (``enable_sleep=True``): released weights are lost until wakeup
  (filled with NaN here), and generating or loading weights into released memory is an error.

Generation decodes with the HF model built from the folder's config on CPU (KV-cached, one sample at a time).
"""

from __future__ import annotations

import base64
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

__version__ = "0.0.0+fake"
IS_FAKE = True
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


class _RestrictedUnpickler(pickle.Unpickler):
    """Like the extension's: refuses storages serialised as bytes (only IPC handles may travel)."""

    REFUSED = {("torch.storage", "_load_from_bytes"), ("torch.hub", "_load_local"), ("torch", "save")}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.REFUSED:
            raise pickle.UnpicklingError(f"refused: {module}.{name}")
        return super().find_class(module, name)


class ModelLoader:
    """``model_loader.reload(model, weights, allow_partial_loading)``: copy by HF parameter name."""

    def reload(
        self, model: torch.nn.Module, weights: dict[str, torch.Tensor], allow_partial_loading: bool
    ) -> None:
        params = dict(model.named_parameters())
        if not allow_partial_loading and set(params) - set(weights):
            raise ValueError(f"missing weights: {sorted(set(params) - set(weights))[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                if name in params:  # unknown names: ignored under partial loading
                    params[name].copy_(tensor.to(params[name].dtype))


class _ModelEngine:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.model_loader = ModelLoader()


class _Engine:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model_engine = _ModelEngine(model)
        self.prefix_cache_resets = 0

    def reset_prefix_cache(self) -> None:
        self.prefix_cache_resets += 1


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
        handles = ipc_handles[uuid]
        if isinstance(handles, str):
            handles = _RestrictedUnpickler(io.BytesIO(base64.b64decode(handles))).load()
            if not isinstance(handles, list):
                raise ValueError(f"Deserialized data must be a list, got {type(handles).__name__}")
        weights = {}
        for name, (func, args) in handles:
            args = list(args)
            if len(args) > 6:  # a CUDA IPC handle: rebuilt on this worker's device
                args[6] = self.device_id
            weights[name] = func(*args)
        self.bucket_bytes.append(sum(t.numel() * t.element_size() for t in weights.values()))
        self.engine.model_engine.model_loader.reload(
            self.engine.model_engine.model, weights, allow_partial_loading=True
        )


class _WorkerBase:
    def __init__(self, model: torch.nn.Module, device_id: int, enable_sleep: bool) -> None:
        self.engine = _Engine(model)
        self.device_id = device_id
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


class LLM:
    def __init__(
        self,
        model: str,
        *,
        backend: str = "pytorch",
        load_format: str = "auto",
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        kv_cache_config: KvCacheConfig | None = None,
        max_batch_size: int = 2048,
        max_seq_len: int | None = None,
        orchestrator_type: str | None = None,
        ray_worker_extension_cls: str | None = None,
        enable_sleep: bool = False,
    ) -> None:
        if backend != "pytorch":
            raise ValueError(f"fake LLM: backend {backend!r}")
        if load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format {load_format!r}")
        if ray_worker_extension_cls is not None and orchestrator_type != "ray":
            raise ValueError("ray_worker_extension_cls needs orchestrator_type='ray'")
        self.init_kwargs = {
            "load_format": load_format,
            "tensor_parallel_size": tensor_parallel_size,
            "kv_cache_config": kv_cache_config,
            "max_batch_size": max_batch_size,
            "max_seq_len": max_seq_len,
            "enable_sleep": enable_sleep,
        }
        config = AutoConfig.from_pretrained(model)
        torch_dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        torch_dtype = torch_dtype if dtype == "auto" else getattr(torch, dtype)
        if isinstance(torch_dtype, str):
            torch_dtype = getattr(torch, torch_dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len or config.max_position_embeddings
        ext = _import_path(ray_worker_extension_cls) if ray_worker_extension_cls else WorkerExtension
        worker_cls = type("FakeRayWorker", (ext, _WorkerBase), {})
        self.workers = []
        for rank in range(tensor_parallel_size):  # TP ranks as replicas (each with a full copy)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1000 + rank)
                if load_format == "dummy":
                    net = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
                else:
                    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype)
            self.workers.append(worker_cls(net.eval(), rank, enable_sleep))
        self.shut_down = False

    # --- collective RPC ------------------------------------------------------------------------
    def _collective_rpc(
        self, method: str, args: tuple = (), kwargs: dict | None = None, non_block: bool = False
    ) -> list[Any]:
        return [getattr(w, method)(*args, **(kwargs or {})) for w in self.workers]

    def shutdown(self) -> None:
        self.shut_down = True

    # --- generation ----------------------------------------------------------------------------
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
        if inputs and isinstance(inputs[0], int):
            inputs = [inputs]
        worker.log.append(("generate", len(inputs)))
        return [self._one(i, list(p), sp, worker.engine.model_engine.model) for i, p in enumerate(inputs)]

    @torch.no_grad()
    def _one(self, rid: int, prompt: list[int], sp: SamplingParams, model: torch.nn.Module) -> RequestOutput:
        if len(prompt) + sp.max_tokens > self.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_tokens ({sp.max_tokens}) > max_seq_len ({self.max_seq_len})"
            )
        gen = torch.Generator().manual_seed(sp.seed or 0)
        end_id = self.tokenizer.eos_token_id if sp.end_id is None else sp.end_id
        stop_ids = [self.tokenizer.encode(s, add_special_tokens=False) for s in _as_list(sp.stop)]
        temperature = 1.0 if sp.temperature is None else sp.temperature
        # transformers >= 5.x names the KV cache `cache` (in and out); earlier ones `past_key_values`
        cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        outputs = []
        for k in range(sp.n):
            toks, lps, reason = [], [], "length"
            step, past = torch.tensor([prompt]), None  # the prompt, then one new token per step (KV cache)
            for _ in range(sp.max_tokens):
                out = model(input_ids=step, use_cache=True, logits_to_keep=1, **{cache_kw: past})
                logits, past = out.logits[0, -1].float(), getattr(out, cache_kw)
                logp = (logits / temperature).log_softmax(-1)
                tok = self._draw(logp, sp, gen)
                top = torch.topk(logp, sp.logprobs or 1)
                entry = {
                    int(t): Logprob(float(v), r + 1) for r, (v, t) in enumerate(zip(top.values, top.indices))
                }
                entry.setdefault(tok, Logprob(float(logp[tok]), int((logp > logp[tok]).sum()) + 1))
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
        if sp.top_k == 1 or sp.temperature == 0:
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


def _as_list(stop: str | list[str] | None) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


def _strip_stop(toks: list[int], lps: list, stop_token_ids: list[int], stop_ids: list[list[int]]):
    if toks and toks[-1] in stop_token_ids:
        return toks[:-1], lps[:-1]
    for ids in stop_ids:
        if ids and toks[-len(ids) :] == ids:
            return toks[: -len(ids)], lps[: -len(ids)]
    return toks, lps


def install(monkeypatch) -> types.ModuleType:
    """Put this fake in ``sys.modules`` as ``tensorrt_llm`` (and the submodules the backend and the
    worker extension import) for one test; returns the fake ``tensorrt_llm`` module."""
    me = sys.modules[__name__]
    root = types.ModuleType("tensorrt_llm")
    root.__dict__.update(
        LLM=LLM, SamplingParams=SamplingParams, __version__=__version__, IS_FAKE=True, fake=me
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
