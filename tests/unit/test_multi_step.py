"""Multi-step episodes: environment errors and time-outs end only their episode, with the reason."""

import threading
import time

import pytest

from nemo_azr.contracts.env import EnvOutput, EvalResult
from nemo_azr.contracts.generation import GenerationOutput, SamplingParams
from nemo_azr.envs.base import END_DONE, END_ERROR, END_MAX_STEPS, END_TIMEOUT
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.multi_step import END_CONTEXT, evaluate_episode, run_episodes, start_episodes
from tests.unit.selfplay_fakes import ScriptedBackend

RELEASE = threading.Event()  # lets the hung env's thread finish at the end of the test


class BehaviourEnv:
    """``task_config["kind"]``: done | raise | hang | never (never done) | bad_reset."""

    def reset(self, tc):
        if tc["kind"] == "bad_reset":
            raise RuntimeError("cannot build the world")
        self.kind = tc["kind"]
        self.steps = 0
        return f"SOLVE {self.kind}"

    def step(self, actions):
        self.steps += 1
        if self.kind == "raise":
            raise ValueError("disk on fire")
        if self.kind == "hang":
            RELEASE.wait(30)
            return EnvOutput("", True)
        return EnvOutput("obs", self.kind == "done" and self.steps == 2)

    def evaluate(self):
        return EvalResult(1.0, 1.0, 1.0)

    def get_history_messages(self):
        return []


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def test_errors_and_timeouts_end_only_their_episode(tokenizer):
    kinds = ["done", "raise", "hang", "never", "bad_reset"]
    episodes = start_episodes([{"kind": k} for k in kinds], BehaviourEnv, tokenizer)
    backend = ScriptedBackend(tokenizer, {})
    t0 = time.monotonic()
    run_episodes(
        episodes, backend, SamplingParams(max_new_tokens=4), tokenizer, max_steps=3, step_timeout_s=0.5
    )
    elapsed = time.monotonic() - t0
    RELEASE.set()
    by_kind = dict(zip(kinds, episodes))
    assert by_kind["done"].end_reason == END_DONE and by_kind["done"].num_turns == 2
    assert by_kind["raise"].end_reason == END_ERROR and "disk on fire" in by_kind["raise"].error
    assert by_kind["hang"].end_reason == END_TIMEOUT and by_kind["hang"].num_turns == 1
    assert by_kind["never"].end_reason == END_MAX_STEPS and by_kind["never"].num_turns == 3
    assert by_kind["bad_reset"].end_reason == END_ERROR and by_kind["bad_reset"].num_turns == 0
    assert "reset" in by_kind["bad_reset"].error
    assert elapsed < 5  # the hung env did not hold the rollout
    # turn 1 had 4 running episodes, turn 2 the two still going (done, never), turn 3 only never
    assert [n for kind, n in backend.calls] == [4, 2, 1]
    # failed episodes score 0 in every dimension (fail closed); finished ones use evaluate()
    for kind in ("raise", "hang", "bad_reset"):
        r = evaluate_episode(by_kind[kind])
        assert (r.safety_score, r.completion_score, r.format_score) == (0.0, 0.0, 0.0)
    assert evaluate_episode(by_kind["done"]).safety_score == 1.0


class LongBackend:
    """Always samples max_new_tokens tokens (finish_reason length)."""

    version = 0

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def generate(self, requests, sampling):
        from nemo_azr.contracts.generation import Sample

        ids = [self.tok.eos_token_id - 1] * sampling.max_new_tokens
        return [GenerationOutput(r, [Sample(ids, [-1.0] * len(ids), "x", "length")], 0) for r in requests]


def test_context_limit_ends_episodes(tokenizer):
    episodes = start_episodes([{"kind": "never"}], BehaviourEnv, tokenizer)
    prompt = len(episodes[0].prompt_ids)
    run_episodes(
        episodes,
        LongBackend(tokenizer),
        SamplingParams(max_new_tokens=20),
        tokenizer,
        max_steps=50,
        max_total_tokens=prompt + 100,
    )
    ep = episodes[0]
    assert ep.end_reason == END_CONTEXT
    assert (
        len(ep.prompt_ids) + len(ep.response_ids) + 20
        > prompt + 100
        >= len(ep.prompt_ids) + len(ep.response_ids)
    )
    # after a length-truncated turn the inserted text closes the turn itself (eos is not a model token)
    assert sum(ep.response_mask) == 20 * ep.num_turns


def test_each_turn_reports_who_played_and_who_goes_on(tokenizer):
    """on_turn(turn, played, going): the progress a long evaluation prints after every turn."""
    episodes = start_episodes([{"kind": k} for k in ("done", "never", "raise")], BehaviourEnv, tokenizer)
    seen = []
    run_episodes(
        episodes,
        ScriptedBackend(tokenizer, {}),
        SamplingParams(max_new_tokens=4),
        tokenizer,
        max_steps=3,
        on_turn=lambda *args: seen.append(args),
    )
    # turn 1: all three play, raise ends; turn 2: done ends; turn 3: never runs out of turns
    assert seen == [(1, 3, 2), (2, 2, 1), (3, 1, 0)]
