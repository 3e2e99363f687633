"""The generation interface: token ids in, sampled token ids and their log-probs out, and the engine
lifecycle every backend implements (seed 004's generation capabilities).

:class:`GenerationBackend` is what the trainer drives: ``generate``; ``sync_weights(policy)`` after
each update (colocated backends copy weights; a disaggregated engine does the same over its
transport, so the trainer never changes) with ``version`` counting syncs; ``release()`` once a
step's rollout is done (an engine frees its GPU memory for the update: trtllm sleeps);
``flush_cache()``; ``shutdown()`` when the run ends; ``refit_metrics`` (the last sync's time and
checks, logged after it; empty where there are none); ``reads_policy_in_place`` (the backend samples
from the training weights themselves, so it gets the policy and not a copy). Workflows only call
``generate``. ``nemo_azr.rollout.engine.GenerationEngineBase`` gives the defaults; docs/generation.md
has the contract suite every backend passes.
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
    version: int  # weight syncs so far: the policy version the samples come from
    refit_metrics: dict[str, float]
    reads_policy_in_place: bool

    def generate(
        self, requests: list[GenerationRequest], sampling: SamplingParams
    ) -> list[GenerationOutput]: ...

    def sync_weights(self, policy: Any) -> None: ...

    def release(self) -> None: ...

    def flush_cache(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class ScoresContinuations(Protocol):
    """A generation backend that scores given continuations under its current weights.

    ``continuation_logprobs(prompts, continuations, temperature=T)``: for prompt ``i`` and each of
    its continuations ``continuations[i][j]`` (token ids), the log-prob of every continuation token
    given the prompt and the tokens before it, under the temperature-scaled policy (the same
    quantity ``Sample.logprobs`` holds for sampled tokens): ``out[i][j][t]``. RLCR's enumerated
    confidences read it (``rlcr.confidence_decoding=enumerate``).
    """

    def continuation_logprobs(
        self,
        prompts: list[list[int]],
        continuations: list[list[list[int]]],
        *,
        temperature: float = 1.0,
    ) -> list[list[list[float]]]: ...
