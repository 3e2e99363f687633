"""``trtllm`` generation backend: TensorRT-LLM's LLM API (PyTorch backend) with weight refit.

Call sequence (TensorRT-LLM's RLHF worker extension, as its own examples and verl drive it):

* start: ``LLM(model=<folder with the HF config + tokenizer>, load_format="dummy", backend="pytorch",
  orchestrator_type="ray", ray_worker_extension_cls=<RefitWorkerExtension>, enable_sleep=True,
  sampler_type="TRTLLMSampler", kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=...), ...)``;
  the keywords are those of the installed release's row in ``trtllm_api.RELEASES`` (an unlisted
  release is refused in one line). The engine holds no real weights until the first refit, which the
  constructor does from the model it is given.
* rollout: ``llm.generate(prompt_token_ids, SamplingParams(n, temperature, top_p, top_k, max_tokens,
  stop, logprobs=1, ...))``; each ``RequestOutput.outputs[i]`` has ``token_ids`` and ``logprobs`` (one
  ``{token_id: Logprob}`` per generated token). The sampler is chosen so that these are the sampled
  token's log-probs under the temperature-scaled distribution (1.2's default TorchSampler returns
  raw-logit log-probs, and only the top-1 token's); a release without per-request seeds gets none
  (its one engine-wide generator decides), and greedy requests with ``n > 1`` are sent once and
  repeated where the release refuses them.
* update phase: :meth:`release` puts the engine to sleep (``_collective_rpc("sleep", (tags,))``) so the
  trainer has the GPU memory; the trainer calls it after the rollout.
* refit (:meth:`sync_weights`): wake the weight memory, send the weights bucket by bucket as CUDA IPC
  handles with the trainer's checksum of every tensor (``_collective_rpc("update_weights_checked",
  ({device_uuid: base64(pickle([(name, handle), ...]))}, {name: (sum, sum of squares)}))``: each rank
  checks what its handles resolve to before loading the bucket), finalise with
  ``update_weights(None)``, wake the KV cache, then the refit guard.

No hang, no half-applied refit: every collective RPC (sleep, wake, each bucket, the finalise) waits at
most ``generation.trtllm.rpc_timeout_s``. A refit that fails or times out part-way leaves an engine
that may hold some new and some old weights, so the backend marks itself failed: it generates nothing
more (a :class:`RefitError` naming the step, the bucket and the engine's error), and the run stops with
its last checkpoint intact; a resume starts a fresh engine.

Refit guard: a fixed probe prompt is sampled at the rollout's temperature and the engine's log-probs
of its tokens are compared with the trainer's own at that temperature (``policy.compute_logprobs``),
so log-probs of another distribution fail here and not silently in the loss. A gap beyond
``generation.trtllm.probe_tolerance`` raises :class:`RefitError` naming the first layer whose
engine checksums (asked through the collective RPC) differ from what the trainer sent; stale or
corrupted weights never generate silently. ``refit_metrics`` holds the last refit's time and gap.

``import tensorrt_llm`` happens in the constructor only, so nothing imports it unless
``generation.backend=trtllm``.
"""

from __future__ import annotations

import base64
import copy
import importlib
import importlib.util
import os
import pickle
import sys
import tempfile
import threading
import time
from typing import Any

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.generation import GenerationOutput, GenerationRequest, Sample, SamplingParams
from nemo_azr.contracts.policy import Policy
from nemo_azr.errors import ConfigError
from nemo_azr.registry import GENERATION_BACKENDS
from nemo_azr.rollout.engine import GenerationEngineBase
from nemo_azr.rollout.trtllm_api import release_surface
from nemo_azr.rollout.trtllm_weights import (
    RefitError,
    checksum_groups,
    combine_rank_checksums,
    compare_checksums,
    engine_weights,
    policy_hf_state,
    tensor_buckets,
)

__all__ = ["EXTENSION_PATH", "TRTLLM_MISSING", "TRTLLMGenerationBackend", "trtllm_available"]

#: The worker extension the engine loads (TensorRT-LLM's RLHF extension + per-parameter checksums).
EXTENSION_PATH = "nemo_azr.rollout.trtllm_worker.RefitWorkerExtension"
TRTLLM_MISSING = (
    "generation.backend=trtllm needs TensorRT-LLM (import tensorrt_llm failed); it is not installable "
    "on CPU machines: run in the GPU container of containers/Dockerfile (containers/README.md), or use "
    "generation.backend=hf"
)
_KV_TAG = "kv_cache"


def trtllm_available() -> bool:
    """Whether ``tensorrt_llm`` can be imported (without importing it)."""
    if "tensorrt_llm" in sys.modules:  # imported already (None: marked as not importable)
        return sys.modules["tensorrt_llm"] is not None
    try:
        return importlib.util.find_spec("tensorrt_llm") is not None
    except (ImportError, ValueError):
        return False


def _import_trtllm() -> Any:
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as e:
        raise ConfigError(TRTLLM_MISSING) from e


def _engine_dtype(name: str, model: torch.nn.Module) -> torch.dtype:
    """The engine's weight dtype: ``auto`` is the one the engine reads from the saved model config."""
    if name != "auto":
        return getattr(torch, name)
    dtype = getattr(model.config, "dtype", None) or getattr(model.config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else next(model.parameters()).dtype


@GENERATION_BACKENDS.register("trtllm")
class TRTLLMGenerationBackend(GenerationEngineBase):
    """A TensorRT-LLM engine refitted from the trainer after every update (``generation=trtllm``)."""

    def __init__(self, model: torch.nn.Module, tokenizer, *, cfg) -> None:
        """``model``: the policy's HF-layout model (its config starts the engine, its weights are the
        first refit); ``cfg``: the ``generation`` config (``cfg.trtllm`` holds the engine keys)."""
        super().__init__()
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            # Each rank would start an engine on the same local GPUs (engine rank r = GPU r).
            raise ConfigError(
                "generation.backend=trtllm drives one engine from one trainer process; with several "
                "ranks (torchrun) use generation.backend=hf or megatron"
            )
        # Ray must leave CUDA_VISIBLE_DEVICES alone in the engine's workers, or their device index no
        # longer names the GPU whose UUID keys the IPC handles (verl sets the same).
        os.environ.setdefault("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
        trt = _import_trtllm()
        from tensorrt_llm.llmapi import KvCacheConfig

        self.cfg = cfg.trtllm
        self.surface = release_surface(getattr(trt, "__version__", "unknown"))
        # the probe samples as the rollout does (its temperature), so it checks the log-probs the
        # loss and the IS correction will read
        self.probe_temperature = float(cfg.temperature)
        self._trt_sampling = trt.SamplingParams
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self.tie_word_embeddings = bool(getattr(model.config, "tie_word_embeddings", False))
        self.dtype = _engine_dtype(self.cfg.dtype, model)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self._asleep: set[str] = set()
        self._failed: str | None = None  # why the engine can no longer be trusted (see _rpc)
        self.probe_ids = tokenizer(self.cfg.probe_prompt, add_special_tokens=False)["input_ids"]
        if not self.probe_ids:
            raise ConfigError("generation.trtllm.probe_prompt encodes to no tokens; give it some text")

        # The engine reads the architecture (and the tokenizer) from a folder; load_format=dummy skips
        # the weights, which arrive by refit below.
        self._folder = tempfile.TemporaryDirectory(prefix="nemo_azr_trtllm_")
        model.config.save_pretrained(self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        kwargs: dict[str, Any] = {
            "model": self._folder.name,
            "backend": "pytorch",
            "load_format": "dummy",  # no checkpoint read: the trainer's weights arrive by refit
            "tensor_parallel_size": self.cfg.tensor_parallel_size,
            "dtype": self.cfg.dtype,
            "kv_cache_config": KvCacheConfig(
                free_gpu_memory_fraction=self.cfg.kv_cache_free_gpu_memory_fraction,
                enable_block_reuse=False,  # a prefix cached under old weights must not be reused
            ),
            "max_batch_size": self.cfg.max_batch_size,
            "orchestrator_type": "ray",  # the collective RPC (update_weights, sleep) needs Ray workers
            "ray_worker_extension_cls": EXTENSION_PATH,
            self.surface.sleep_keyword: self.cfg.sleep,
            # the sampler whose log-probs are those of the temperature-scaled distribution
            "sampler_type": self.surface.sampler_type,
        }
        if self.cfg.max_seq_len:
            kwargs["max_seq_len"] = self.cfg.max_seq_len
        unlisted = sorted(set(kwargs) - self.surface.llm_keywords)
        if unlisted:
            raise ConfigError(
                f"TensorRT-LLM {self.surface.release} does not take LLM argument(s) {unlisted} "
                "(nemo_azr/rollout/trtllm_api.py lists what each release takes)"
            )
        self.llm = trt.LLM(**kwargs)
        # Which GPU each engine rank runs on, as the rank itself reports it: under Ray's placement
        # rank r need not run on GPU r, and update_weights keys the IPC handles by device UUID.
        self._rank_uuids = [
            str(u) for u in self._rpc("device_uuid", during="asking the engine's ranks for their GPUs")
        ]
        self._rank_devices = [self._local_device(u) for u in self._rank_uuids]
        self._refit(model, version=0)  # the weights the engine starts from

    # --- capabilities ---------------------------------------------------------------------------
    def sync_weights(self, policy) -> None:
        """Refit the engine from the trainer (HF policy, or megatron shards via their HF export),
        bump ``version``, then check it with the probe (:class:`RefitError` on a mismatch)."""
        self._refit(policy, version=self.version + 1)
        self.version += 1

    def release(self) -> None:
        """Put the engine to sleep (weights and KV cache memory released) for the update phase."""
        if self.cfg.sleep and not self._asleep:
            self._rpc("sleep", (list(self.cfg.sleep_tags),), during="releasing the engine's memory")
            self._asleep = set(self.cfg.sleep_tags)

    def flush_cache(self) -> None:
        """Block reuse is off, so no prefix outlives a request."""

    def shutdown(self) -> None:
        self.llm.shutdown()
        self._folder.cleanup()

    def _wake(self, tags: list[str]) -> None:
        tags = [t for t in tags if t in self._asleep]
        if tags:
            self._rpc("wakeup", (tags,), during=f"waking {', '.join(tags)}")
            self._asleep -= set(tags)

    def _local_device(self, uuid: str) -> torch.device:
        """This process's device for the GPU an engine rank reported (CPU when there is no CUDA)."""
        if self.device is None:
            return torch.device("cpu")
        want = _uuid_hex(uuid)
        for index in range(torch.cuda.device_count()):
            if _uuid_hex(str(torch.cuda.get_device_properties(index).uuid)) == want:
                return torch.device("cuda", index)
        raise ConfigError(
            f"an engine rank runs on GPU {uuid}, which this trainer process does not see: the weights "
            "travel as CUDA IPC handles, so the trainer must see every engine GPU (check "
            "CUDA_VISIBLE_DEVICES and the Ray placement)"
        )

    # --- the engine's RPCs: bounded in time, and fatal to the engine when they fail ---------------
    def _rpc(self, method: str, args: tuple = (), *, during: str) -> list[Any]:
        """``llm._collective_rpc(method, args)`` waiting at most ``rpc_timeout_s``. A timeout or an
        error leaves the engine in an unknown state (weights half-loaded, memory half-released): the
        backend is marked failed and refuses to generate. The call runs in a daemon thread because a
        collective RPC has no timeout of its own, and a hung one must not keep the process alive."""
        self._check_usable()
        box: dict[str, Any] = {}

        def call() -> None:
            try:
                box["result"] = self.llm._collective_rpc(method, args=args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=call, name=f"trtllm-rpc-{method}", daemon=True)
        worker.start()
        worker.join(self.cfg.rpc_timeout_s)
        if worker.is_alive():
            raise self._mark_failed(
                f"{during}: the engine's workers did not answer {method} within "
                f"generation.trtllm.rpc_timeout_s={self.cfg.rpc_timeout_s:g} s"
            )
        if "error" in box:
            exc = box["error"]
            raise self._mark_failed(
                f"{during}: {method} failed in the engine ({type(exc).__name__}: {exc})"
            ) from exc
        return box["result"]

    def _mark_failed(self, what: str) -> RefitError:
        self._failed = (
            f"trtllm engine: {what}; its weights are not known to be the trainer's (part of a refit may "
            "have landed), so it generates nothing more (the run stops with its last checkpoint intact; "
            "a resume starts a fresh engine)"
        )
        return RefitError(self._failed)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise RefitError(self._failed)

    # --- refit ----------------------------------------------------------------------------------
    def _refit(self, source, *, version: int) -> None:
        t0 = time.perf_counter()
        self._wake([t for t in self.cfg.sleep_tags if t != _KV_TAG])  # weights first: the KV cache waits
        # in flux until checked: a rank that stops part-way reports -1, never the old or the new version
        self._rpc("set_weight_version", (-1,), during=f"refit to policy version {version}, starting")
        state = policy_hf_state(source)
        items = engine_weights(state, tie_word_embeddings=self.tie_word_embeddings)
        bucket_bytes = self.cfg.refit_bucket_mb * 2**20
        buckets = sent = 0
        for bucket in tensor_buckets(items, bucket_bytes=bucket_bytes, dtype=self.dtype):
            where = f"refit to policy version {version}, bucket {buckets + 1} ({sent / 2**20:.1f} MB sent before it)"
            sent += self._send_bucket(bucket, during=where)
            buckets += 1
        # finalise (post-load processing)
        self._rpc("update_weights", (None,), during=f"refit to policy version {version}, finalising")
        self._wake([_KV_TAG])
        t_sent = time.perf_counter()
        gap, gap_mean = self._probe(source)
        if gap > self.cfg.probe_tolerance:
            self._fail(items, gap, version)
        self._rpc("set_weight_version", (version,), during=f"refit to policy version {version}, stamping")
        self.refit_metrics = {
            "timing/engine_refit_s": t_sent - t0,
            "timing/engine_probe_s": time.perf_counter() - t_sent,
            "generation/probe_logprob_gap": gap,
            "generation/probe_logprob_gap_mean": gap_mean,
            "generation/refit_buckets": float(buckets),
            "generation/refit_mb": sent / 2**20,
        }

    def _send_bucket(self, bucket: list[tuple[str, torch.Tensor]], *, during: str) -> int:
        """One ``update_weights`` call carrying the bucket for every engine rank (each reads the handles
        of its own device); the bucket's engine-dtype copies live only during the call."""
        from torch.multiprocessing.reductions import reduce_tensor

        payload: dict[str, Any] = {}
        copies: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}  # alive until the engine loaded them
        sums: dict[str, tuple[float, float]] = {}  # what the trainer sent, checked by every rank
        for uuid, device in zip(self._rank_uuids, self._rank_devices):
            # one copy per GPU the ranks run on (the GPU each rank reported, not "rank r = GPU r");
            # on CPU (no CUDA IPC) every rank shares one copy
            if device not in copies:
                copies[device] = [
                    (n, t.detach().to(device=device, dtype=self.dtype).contiguous()) for n, t in bucket
                ]
                if not sums:
                    sums = {n: _sum_and_squares(t) for n, t in copies[device]}
            handles = [(name, reduce_tensor(t)) for name, t in copies[device]]
            # CUDA handles travel pickled and base64-encoded (the extension unpickles them with a
            # restricted unpickler); CPU tensors go as the plain list it also accepts.
            payload[uuid] = (
                base64.b64encode(pickle.dumps(handles)).decode() if device.type == "cuda" else handles
            )
        self._rpc("update_weights_checked", (payload, sums), during=during)
        nbytes = sum(t.numel() * t.element_size() for _, t in next(iter(copies.values())))
        del copies, payload
        return nbytes

    # --- refit guard ----------------------------------------------------------------------------
    def _probe(self, source) -> tuple[float, float]:
        """(max, mean) |engine - trainer| log-prob over the probe's sampled tokens, both at the
        rollout's temperature (no top-k / top-p: the trainer's log-probs have no truncation either)."""
        sp = self._trt_sampling(
            n=1,
            max_tokens=self.cfg.probe_length,
            temperature=self.probe_temperature,
            top_p=1.0,
            top_k=0,
            logprobs=1,
            ignore_eos=True,
            detokenize=False,
        )
        out = self.llm.generate([list(self.probe_ids)], sp, use_tqdm=False)[0].outputs[0]
        tokens = list(out.token_ids)
        engine = torch.tensor(_sampled_logprobs(out.logprobs, tokens))
        trainer = _trainer_logprobs(
            source, self.probe_ids, tokens, pad_id=self.pad_id, temperature=self.probe_temperature
        )
        diff = (engine - trainer).abs()
        if not bool(torch.isfinite(diff).all()):
            return float("inf"), float("inf")
        return float(diff.max()), float(diff.mean())

    def _fail(self, items: list[tuple[str, torch.Tensor]], gap: float, version: int) -> None:
        """Raise the probe's :class:`RefitError` (naming the first bad layer when there is one) and
        leave the backend failed: the engine holds weights other than the trainer's."""
        per_rank = self._rpc("weight_checksums", during=f"refit to policy version {version}, checksums")
        engine = combine_rank_checksums(list(per_rank))
        trainer = checksum_groups(items, dtype=self.dtype)
        bad = compare_checksums(trainer, engine, rtol=self.cfg.checksum_rtol)
        tol = self.cfg.probe_tolerance
        if bad:
            more = (
                f" ({len(bad) - 1} more: {', '.join(bad[1:4])}{'...' if len(bad) > 4 else ''})"
                if bad[1:]
                else ""
            )
            self._failed = (
                f"trtllm refit to policy version {version}: the engine's probe log-probs differ from "
                f"the trainer's by {gap:.4g} > generation.trtllm.probe_tolerance={tol}; first bad layer: "
                f"{bad[0]}{more} (its engine weights differ from those sent)"
            )
            raise RefitError(self._failed)
        self._failed = (
            f"trtllm refit to policy version {version}: the engine's probe log-probs differ from the "
            f"trainer's by {gap:.4g} > generation.trtllm.probe_tolerance={tol}, yet every layer's weights "
            "match what was sent: a numerics or model-config mismatch (dtype, rope scaling), not stale "
            "weights; raise the tolerance only if that gap is expected for generation.trtllm.dtype"
        )
        raise RefitError(self._failed)

    # --- generation -----------------------------------------------------------------------------
    def _sampling(self, sp: SamplingParams) -> Any:
        kw: dict[str, Any] = {
            "n": self._engine_n(sp),
            "max_tokens": sp.max_new_tokens,
            "logprobs": 1,  # the sampled token's log-prob
            # EOS as a stop token kept in the output (the contract's token_ids end with it)
            "end_id": -1,
            "pad_id": self.pad_id,
            "stop_token_ids": [self.eos_id],
            "include_stop_str_in_output": True,
            "detokenize": False,
        }
        if self.surface.per_request_seed:
            kw["seed"] = int(torch.randint(0, 2**31 - 1, ()))  # follows the trainer's seeding
        if sp.greedy:
            kw.update(temperature=1.0, top_p=1.0, top_k=1)
        else:
            kw.update(temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k)
        if sp.stop_strings:
            kw["stop"] = list(sp.stop_strings)
        return self._trt_sampling(**kw)

    def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[GenerationOutput]:
        self._check_usable()
        self._wake(list(self.cfg.sleep_tags))  # a generate between release() and the refit (e.g. eval)
        held = self._held_version()
        results = self.llm.generate(
            [list(r.prompt_ids) for r in requests], self._sampling(sampling), use_tqdm=False
        )
        outputs = []
        for req, res in zip(requests, results):
            samples = [self._sample(c, sampling) for c in res.outputs[: sampling.n]]
            while len(samples) < sampling.n:  # greedy sent once (_engine_n): every sample is the same
                samples.append(copy.deepcopy(samples[0]))
            outputs.append(GenerationOutput(request=req, samples=samples, policy_version=held))
        return outputs

    def _engine_n(self, sp: SamplingParams) -> int:
        """Samples asked of the engine: a release that refuses greedy with n > 1 gets one (greedy
        decoding gives the same sample every time)."""
        return 1 if sp.greedy and not self.surface.greedy_n_above_one else sp.n

    def _held_version(self) -> int:
        """The policy version every engine rank says it holds (stamped on the rows it generates);
        ranks that disagree, or a version other than the last refit's, stop the rollout."""
        held = sorted({int(v) for v in self._rpc("get_weight_version", during="reading the weight version")})
        if held != [self.version]:
            raise self._mark_failed(
                f"its ranks hold weights of policy version(s) {held}, the last refit sent version "
                f"{self.version} (-1: a refit that never finished on that rank)"
            )
        return held[0]

    def _sample(self, completion, sp: SamplingParams) -> Sample:
        """Contract sample from one ``CompletionOutput``: ends at EOS or the first stop string (found
        in the decoded text, as the hf backend does, whatever the engine's token-level stop did)."""
        tokens = list(completion.token_ids)[: sp.max_new_tokens]
        logps = _sampled_logprobs(completion.logprobs, tokens)
        reason, end = "length", len(tokens)
        for t, tok in enumerate(tokens):
            if tok == self.eos_id:
                reason, end = "eos", t + 1
                break
            if sp.stop_strings:
                text = self.tokenizer.decode(tokens[: t + 1], skip_special_tokens=True)
                if any(s in text for s in sp.stop_strings):
                    reason, end = "stop", t + 1
                    break
        tokens, logps = tokens[:end], logps[:end]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return Sample(token_ids=tokens, logprobs=logps, text=text, finish_reason=reason)


def _sum_and_squares(t: torch.Tensor) -> tuple[float, float]:
    d = t.double()
    return float(d.sum()), float((d * d).sum())


def _uuid_hex(uuid: str) -> str:
    """A GPU UUID as bare lowercase hex: NVML writes ``GPU-xxxxxxxx-...``, torch the digits alone."""
    text = uuid.strip().lower()
    text = text.removeprefix("gpu-")
    return "".join(ch for ch in text if ch in "0123456789abcdef")


def _sampled_logprobs(logprobs, tokens: list[int]) -> list[float]:
    """The log-prob of each sampled token from the engine's per-token ``{token_id: Logprob}`` dicts
    (plain floats are accepted too)."""
    if logprobs is None or len(logprobs) < len(tokens):
        raise RefitError(
            "the TensorRT-LLM engine returned no log-prob for some generated tokens (SamplingParams.logprobs=1)"
        )
    out = []
    for tok, entry in zip(tokens, logprobs):
        if isinstance(entry, dict):
            if tok not in entry:
                raise RefitError(
                    f"the TensorRT-LLM engine's log-probs miss the sampled token {tok} (a sampler that "
                    "returns the top-1 token's instead, as 1.2's TorchSampler does); the backend asks for "
                    "the sampler its release row names (nemo_azr/rollout/trtllm_api.py)"
                )
            entry = entry[tok]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


@torch.no_grad()
def _trainer_logprobs(
    source, prompt: list[int], tokens: list[int], *, pad_id: int, temperature: float = 1.0
) -> torch.Tensor:
    """The trainer's log-probs at ``temperature`` of ``tokens`` after ``prompt``: the policy's own
    ``compute_logprobs`` (megatron: collective), or a plain forward of an HF model (the first refit)."""
    packed = pack_prompt_response([prompt], [tokens], None, pad_id=pad_id)
    mask = packed["loss_mask"][0] > 0
    if isinstance(source, Policy):
        saved = source.temperature
        source.temperature = temperature
        try:
            return source.compute_logprobs(Batch(packed))[0][mask].float()
        finally:
            source.temperature = saved
    model = source if isinstance(source, torch.nn.Module) else source.model
    device = next(model.parameters()).device
    logits = (
        model(
            input_ids=packed["input_ids"].to(device),
            attention_mask=packed["attention_mask"].to(device),
            position_ids=packed["position_ids"].to(device),
        )
        .logits[0, :-1]
        .float()
        / temperature
    )
    lp = logits.log_softmax(-1).gather(-1, packed["input_ids"][0, 1:, None].to(device))[:, 0]
    return lp[mask[1:].to(device)].cpu()
