"""The TensorRT-LLM API surface the ``trtllm`` backend uses, recorded per supported release.

TensorRT-LLM's LLM API moves between releases: constructor keywords are renamed (``enable_sleep``
became ``sleep_config``), unknown keywords are refused, and what ``logprobs`` returns depends on the
sampler. One table, :data:`RELEASES`, records for each supported release exactly what the backend
passes and relies on; the backend reads it to build its start arguments and sampling parameters, and
the test fake (tests/fakes/fake_tensorrt_llm.py) reads it to accept exactly those and behave like that
release, so a version bump is a new row whose difference from the old one says what changed.

A release that is not in the table is refused at start with one line naming it and the supported
ones (:func:`release_surface`): running an unchecked release would at best fail deep inside the engine
and at worst return log-probs of another distribution without a word.

Nothing here imports TensorRT-LLM.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_azr.errors import ConfigError

__all__ = ["RELEASES", "LATER_CHANGES", "ReleaseSurface", "release_surface"]


@dataclass(frozen=True)
class ReleaseSurface:
    """What the backend passes to and expects from one TensorRT-LLM release."""

    release: str  # major.minor, matched against tensorrt_llm.__version__
    pinned: str  # the exact version containers/Dockerfile installs
    checked_against: str  # the sources this row was read from
    llm_keywords: frozenset[str]  # every keyword the backend may pass to tensorrt_llm.LLM(...)
    sampling_fields: frozenset[str]  # every SamplingParams field the backend may set
    # The sampler whose log-probs are of the distribution the tokens were drawn from (temperature
    # applied), passed as LLM(sampler_type=...). The default TorchSampler returns raw-logit log-probs.
    sampler_type: str
    per_request_seed: bool  # whether SamplingParams.seed seeds that request (else one engine-wide generator)
    greedy_n_above_one: bool  # whether greedy decoding (top_k=1) accepts n > 1
    sleep_keyword: str  # the LLM keyword that enables sleep/wakeup
    rpc_methods: frozenset[str]  # the worker-extension methods called over LLM._collective_rpc
    update_weights_payload: str  # the layout update_weights takes (documentation; the fake checks it)


_RPC = frozenset(
    {
        # TensorRT-LLM's RLHF worker extension (tensorrt_llm/llmapi/rlhf_utils.py)
        "update_weights",
        "sleep",
        "wakeup",
        # nemo_azr.rollout.trtllm_worker.RefitWorkerExtension on top of it
        "device_uuid",
        "set_weight_version",
        "get_weight_version",
        "weight_checksums",
        "update_weights_checked",
    }
)

RELEASES: dict[str, ReleaseSurface] = {
    "1.2": ReleaseSurface(
        release="1.2",
        pinned="1.2.1",
        checked_against=(
            "TensorRT-LLM 1.2-era llmapi/llm_args.py, sampling_params.py, _torch/pyexecutor/sampler.py, "
            "executor/ray_gpu_worker.py, llmapi/rlhf_utils.py; verl's TensorRT-LLM rollout "
            "(sampler_type=TRTLLMSampler, logprobs=1, enable_sleep=True)"
        ),
        llm_keywords=frozenset(
            {
                "model",
                "backend",
                "load_format",
                "tensor_parallel_size",
                "dtype",
                "kv_cache_config",
                "max_batch_size",
                "max_seq_len",
                "orchestrator_type",
                "ray_worker_extension_cls",
                "enable_sleep",
                "sampler_type",
            }
        ),
        sampling_fields=frozenset(
            {
                "n",
                "max_tokens",
                "logprobs",
                "end_id",
                "pad_id",
                "stop_token_ids",
                "include_stop_str_in_output",
                "detokenize",
                "temperature",
                "top_p",
                "top_k",
                "stop",
                "ignore_eos",
            }
        ),
        sampler_type="TRTLLMSampler",
        per_request_seed=False,
        greedy_n_above_one=False,
        sleep_keyword="enable_sleep",
        rpc_methods=_RPC,
        update_weights_payload=(
            "{device_uuid: base64(pickle([(name, (rebuild_fn, args)), ...]))}, args[6] the device index; "
            "None finalises"
        ),
    ),
}

#: Changes on TensorRT-LLM's main branch after 1.2 that a new row must take into account (each seen in
#: the project's sources; the release that first ships each is read from its notes when the row is added).
LATER_CHANGES = (
    "SamplingParams.logprobs_mode (raw | processed) for TorchSampler (pull request 9675, 2026-01)",
    "LLM(sleep_config=SleepConfig(...)) replaces enable_sleep (pull request 11889, 2026-03)",
    "per-request SamplingParams.seed in TorchSampler (pull request 17172, 2026-08)",
)


def release_surface(version: str) -> ReleaseSurface:
    """The table row for an installed ``tensorrt_llm.__version__`` (matched on major.minor), or one
    :class:`ConfigError` naming the release and the supported ones."""
    parts = str(version).split("+")[0].split(".")
    key = ".".join(parts[:2])
    if key in RELEASES:
        return RELEASES[key]
    supported = ", ".join(f"{r.release} (pinned {r.pinned})" for r in RELEASES.values())
    raise ConfigError(
        f"TensorRT-LLM {version} is not a release the trtllm backend was checked against (supported: "
        f"{supported}); its LLM API differs between releases (docs/generation.md, 'Releases'): install "
        "the pinned one (containers/Dockerfile) or add a row to nemo_azr/rollout/trtllm_api.py"
    )
