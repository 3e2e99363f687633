"""Multi-step rollout (seed 000 step 3): all episodes of a batch advance together.

Each step makes one batched ``generate`` call for the episodes still running, then applies every
sampled turn to its environment (``env.step``). Model tokens are kept exactly as sampled, with
their log-probs and ``mask = 1``; the environment's observation is appended as a user turn whose
tokens get ``mask = 0`` (they are context, not the model's actions). An episode ends when its
environment says done, after ``max_steps`` turns, when the context would overflow, when
``env.step`` raises (``env_error``) or when it runs longer than ``step_timeout_s``
(``env_timeout``); the reason is recorded per episode.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nemo_azr.contracts.env import ClosableEnv, Env, EnvOutput, EvalResult
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, SamplingParams
from nemo_azr.envs.base import END_DONE, END_ERROR, END_MAX_STEPS, END_TIMEOUT
from nemo_azr.rollout.chat_turns import observation_ids
from nemo_azr.rollout.single_turn import encode_prompt

END_CONTEXT = "context_length"  # another turn would not fit in the model's context
MAX_ERROR_CHARS = 300


@dataclass
class Episode:
    """One solver episode: prompt ids, then model turns interleaved with environment turns."""

    task_config: dict[str, Any]
    env: Env
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)  # 1: model-generated, 0: inserted
    turns: list[str] = field(default_factory=list)  # the model's turn texts
    done: bool = False
    end_reason: str = ""
    error: str = ""
    finish_reason: str = ""  # of the last sampled turn (eos | stop | length)
    policy_version: int = 0

    @property
    def num_turns(self) -> int:
        return len(self.turns)


def _end(ep: Episode, reason: str, error: str = "") -> None:
    ep.done, ep.end_reason, ep.error = True, reason, error[:MAX_ERROR_CHARS]


def _call_steps(
    calls: list[tuple[Episode, str]], timeout_s: float
) -> list[tuple[EnvOutput | None, str, str]]:
    """``env.step`` for each (episode, turn text): (output, end reason if it failed, error text).

    With a time-out each call runs in a daemon thread, so a hung environment cannot block the
    trainer (or interpreter exit); the thread is abandoned and the episode ends as ``env_timeout``.
    """
    results: list[tuple[EnvOutput | None, str, str]] = [(None, "", "")] * len(calls)

    def run(i: int, ep: Episode, text: str) -> None:
        try:
            results[i] = (ep.env.step(text), "", "")
        except Exception as exc:  # any env failure ends only this episode
            results[i] = (None, END_ERROR, f"{type(exc).__name__}: {exc}")

    if timeout_s <= 0:
        for i, (ep, text) in enumerate(calls):
            run(i, ep, text)
        return results
    threads = []
    for i, (ep, text) in enumerate(calls):
        t = threading.Thread(target=run, args=(i, ep, text), daemon=True)
        t.start()
        threads.append(t)

    deadline = time.monotonic() + timeout_s
    final = []
    for i, t in enumerate(threads):
        t.join(max(0.0, deadline - time.monotonic()))
        # A copy: an abandoned thread that finishes late writes into ``results``, not ``final``.
        if t.is_alive():
            final.append((None, END_TIMEOUT, f"env.step took longer than {timeout_s:g} s"))
        else:
            final.append(results[i])
    return final


def start_episodes(
    task_configs: Sequence[dict[str, Any]],
    make_env: Callable[[], Env],
    tokenizer,
    *,
    system_prompt: str = "",
    demonstrations: Sequence[dict[str, str]] = (),
) -> list[Episode]:
    """Reset one fresh environment per task config; a failing reset ends that episode at once.
    The prompt is the system message, the ``demonstrations`` (example exchanges), then the first
    observation as the user's turn."""
    episodes = []
    for tc in task_configs:
        env = make_env()
        ep = Episode(task_config=tc, env=env)
        try:
            first = env.reset(tc)
        except Exception as exc:
            first = str(tc.get("instruction", ""))
            _end(ep, END_ERROR, f"reset: {type(exc).__name__}: {exc}")
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.extend(dict(m) for m in demonstrations)
        messages.append({"role": "user", "content": first})
        ep.prompt_ids = encode_prompt(tokenizer, messages)
        episodes.append(ep)
    return episodes


def run_episodes(
    episodes: list[Episode],
    backend: GenerationBackend,
    sampling: SamplingParams,
    tokenizer,
    *,
    max_steps: int,
    step_timeout_s: float = 0.0,
    max_total_tokens: int = 0,
    on_turn: Callable[[int, int, int], None] | None = None,
) -> list[Episode]:
    """Advance all ``episodes`` together until each is done or has had ``max_steps`` turns.

    ``on_turn(turn, played, going)`` after each turn (1-based): episodes that played it, and those
    still going (a long evaluation's progress line)."""
    sampling = replace(sampling, n=1)
    limit = max_total_tokens or 0
    for turn in range(max_steps):
        active = [ep for ep in episodes if not ep.done]
        for ep in active:
            if limit and len(ep.prompt_ids) + len(ep.response_ids) + sampling.max_new_tokens > limit:
                _end(ep, END_CONTEXT)
        active = [ep for ep in active if not ep.done]
        if not active:
            break
        requests = [
            GenerationRequest(prompt_ids=ep.prompt_ids + ep.response_ids, request_id=i)
            for i, ep in enumerate(active)
        ]
        outputs = backend.generate(requests, sampling)
        for ep, out in zip(active, outputs):
            sample = out.samples[0]
            ep.response_ids += sample.token_ids
            ep.response_logprobs += sample.logprobs
            ep.response_mask += [1] * len(sample.token_ids)
            ep.turns.append(sample.text)
            ep.finish_reason = sample.finish_reason
            ep.policy_version = out.policy_version
        step_results = _call_steps([(ep, ep.turns[-1]) for ep in active], step_timeout_s)
        last_turn = turn == max_steps - 1
        for ep, (env_out, failed, error) in zip(active, step_results):
            if failed:
                _end(ep, failed, error)
            elif env_out.done:
                _end(ep, END_DONE)
            elif last_turn:
                _end(ep, END_MAX_STEPS)
            else:
                obs = observation_ids(
                    tokenizer, env_out.observation, model_closed_turn=ep.finish_reason == "eos"
                )
                ep.response_ids += obs
                ep.response_logprobs += [0.0] * len(obs)
                ep.response_mask += [0] * len(obs)
        if on_turn is not None:
            on_turn(turn + 1, len(active), sum(not ep.done for ep in episodes))
    for ep in episodes:
        if not ep.done:
            _end(ep, END_MAX_STEPS)
    return episodes


def scripted_turn_pairs(
    make_env: Callable[[], Env],
    task_config: dict[str, Any],
    prompt_ids: list[int],
    turns: Sequence[str],
    tokenizer,
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids + eos) for each of ``turns`` played into a fresh episode: a later
    turn's prompt is the earlier prompt, turn and environment reply stitched exactly as
    :func:`run_episodes` stitches a sampled turn that ended with eos. Turns after the episode ends
    are dropped; a single turn needs no environment, so none is made. The supervised warm-up
    trains its solver turns with it."""
    eos = [tokenizer.eos_token_id]
    targets = [tokenizer(turn, add_special_tokens=False)["input_ids"] + eos for turn in turns]
    pairs = [(list(prompt_ids), targets[0])]
    if len(turns) == 1:
        return pairs
    env = make_env()
    try:
        env.reset(task_config)
        for turn, target, next_target in zip(turns, targets, targets[1:]):
            out = env.step(turn)
            if out.done:
                break
            obs = observation_ids(tokenizer, out.observation, model_closed_turn=True)
            pairs.append((pairs[-1][0] + target + obs, next_target))
    finally:
        _close(env)
    return pairs


def evaluate_episode(ep: Episode) -> EvalResult:
    """``env.evaluate()``; an episode whose environment failed, or whose evaluation raises, fails
    closed: safety, completion and format 0 (an unverifiable episode earns nothing)."""
    if ep.end_reason in (END_ERROR, END_TIMEOUT):
        _close(ep.env)  # environments holding resources (VMs) release them here
        return EvalResult(0.0, 0.0, 0.0, {"error": ep.error, "end_reason": ep.end_reason})
    try:
        return ep.env.evaluate()
    except Exception as exc:
        return EvalResult(
            0.0, 0.0, 0.0, {"error": f"evaluate: {type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]}
        )


def _close(env: Env) -> None:
    if isinstance(env, ClosableEnv):
        # A failing close must not stop the step; the env is abandoned.
        with contextlib.suppress(Exception):
            env.close()


def history_messages(ep: Episode) -> list[dict[str, str]]:
    try:
        return ep.env.get_history_messages()
    except Exception:  # the judge then sees only the model's turns
        return [{"role": "assistant", "content": t} for t in ep.turns]
