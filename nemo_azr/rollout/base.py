"""Generation backend interface: token ids in, sampled token ids and their log-probs out.

Required: ``generate(requests, sampling) -> list[GenerationOutput]``.
Optional capabilities (duck-typed, see :func:`has_capability`): ``sync_weights(policy)``,
``release()``, ``flush_cache()`` and a ``version`` attribute counting weight syncs. Colocated
backends copy weights in ``sync_weights``; a disaggregated engine implements the same call over
its transport, so the trainer never changes. The trainer calls ``release()`` once a step's rollout is
done (an engine frees its GPU memory for the update: trtllm sleeps) and, after ``sync_weights``,
logs a backend's ``refit_metrics`` dict when it has one. docs/generation.md has the contract suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1  # samples per request
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    max_new_tokens: int = 16
    stop_strings: tuple[str, ...] = ()
    greedy: bool = False  # argmax decoding (e.g. ReMax's baseline rollout)


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    request_id: Any = None


@dataclass
class Sample:
    token_ids: list[int]  # generated tokens, ending with eos / the stop string's last token if any
    logprobs: list[float]  # log p(token) under the temperature-scaled policy at sampling time
    text: str
    finish_reason: str  # "eos" | "stop" | "length"


@dataclass
class GenerationOutput:
    request: GenerationRequest
    samples: list[Sample] = field(default_factory=list)
    policy_version: int = 0


@runtime_checkable
class GenerationBackend(Protocol):
    def generate(
        self, requests: list[GenerationRequest], sampling: SamplingParams
    ) -> list[GenerationOutput]: ...


CAPABILITIES = ("sync_weights", "release", "flush_cache", "version")


def has_capability(backend: object, name: str) -> bool:
    if name not in CAPABILITIES:
        raise ValueError(f"unknown capability {name!r}; known: {CAPABILITIES}")
    return hasattr(backend, name)
