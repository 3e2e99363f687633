"""The environment protocol (seed 000 steps 2-4) and the self-play domain protocol.

An :class:`Env` is one episode's world: ``reset(task_config)`` prepares it and returns the first
observation (the user message the solver sees), ``step(actions)`` applies one model turn (the turn's
text; it may hold several action lines) and returns an :class:`EnvOutput`, ``evaluate()`` gives the
rule-based :class:`EvalResult` of the finished episode and ``get_history_messages()`` the whole
interaction as chat messages (what an LLM judge reads).

A :class:`ProposalDomain` is what Absolute Zero self-play needs on top: seed tasks, the proposer's
prompt for a seed, the parser that turns a proposer's text into a question group (a list of
``task_config`` dicts, or :class:`ProposalError`), a fresh ``Env`` per episode, and the templated
texts of the supervised warm-up. Domains register in :data:`nemo_azr.registry.ENVIRONMENTS` and are
built as ``cls(cfg, seed=...)`` with ``cfg`` the ``absolute_zero`` config node.
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from nemo_azr.contracts.env import Env
from nemo_azr.contracts.task import Example
from nemo_azr.errors import NemoAzrError

#: Why an episode ended (``EnvOutput.info["end_reason"]`` / the rollout's per-row meta).
END_DONE = "done"  # the env said the task is over (the model finished or refused)
END_MAX_STEPS = "max_steps"  # the rollout ran out of turns
END_ERROR = "env_error"  # env.step raised; the episode ends and the error is recorded
END_TIMEOUT = "env_timeout"  # env.step took longer than the configured limit


class ProposalError(NemoAzrError):
    """A proposer's output could not be turned into a valid question group (re-proposed)."""


#: Proposals nest a few levels (questions -> question -> evaluator -> options); deeper is garbage
#: that would only overflow the stack of whatever walks it later (copies, dumps, validators).
MAX_JSON_DEPTH = 32


def decode_json_at(text: str, start: int) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode`` from ``start``: ``(value, end)``. Malformed or too deeply
    nested JSON (which makes the decoder itself raise RecursionError) is a :class:`ProposalError`."""
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise ProposalError(f"proposal is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProposalError(f"proposal JSON is nested deeper than {MAX_JSON_DEPTH} levels") from None
    if _json_depth(value) > MAX_JSON_DEPTH:
        raise ProposalError(f"proposal JSON is nested deeper than {MAX_JSON_DEPTH} levels")
    return value, end


def _json_depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # no need to look further down
                stack.extend(
                    (child, depth + 1) for child in (node.values() if isinstance(node, dict) else node)
                )
    return deepest


class ProposalDomain(ABC):
    """Seed tasks + proposer prompt/parser + environment factory for one kind of world."""

    name: str = "domain"

    def __init__(self, cfg: Any = None, *, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed

    @abstractmethod
    def seed_tasks(self) -> list[Example]:
        """The seed tasks the proposer starts from (stable ``prompt_id`` values)."""

    @abstractmethod
    def proposer_messages(self, seed_task: Example, num_questions: int) -> list[dict[str, str]]:
        """Chat messages asking the proposer for a group of ``num_questions`` questions."""

    @abstractmethod
    def parse_proposal(self, text: str, seed_task: Example, num_questions: int) -> list[dict[str, Any]]:
        """The question group as ``task_config`` dicts; raises :class:`ProposalError` when the text
        is not a valid group (bad JSON, missing fields, a question that cannot be evaluated)."""

    def parse_proposals(
        self, texts: Sequence[str], seed_tasks: Sequence[Example], num_questions: int
    ) -> list[list[dict[str, Any]] | ProposalError]:
        """:meth:`parse_proposal` of each text, in order: the question group, or the
        :class:`ProposalError` that rejected it. A domain whose parsing waits on something (a
        sandbox) may override this to parse concurrently."""
        out: list[list[dict[str, Any]] | ProposalError] = []
        for text, seed_task in zip(texts, seed_tasks):
            try:
                out.append(list(self.parse_proposal(text, seed_task, num_questions)))
            except ProposalError as exc:
                out.append(exc)
        return out

    def timing(self) -> dict[str, float]:
        """Cumulative ``timing/*`` seconds the domain measures itself (e.g. ``timing/sandbox_s``);
        the workflow logs each step's increase."""
        return {}

    @abstractmethod
    def make_env(self) -> Env:
        """A fresh environment for one episode."""

    def solver_system_prompt(self) -> str:
        """System message of every solver episode ("" for none)."""
        return ""

    def solver_demonstrations(self) -> list[dict[str, str]]:
        """Example exchanges shown after the system message of every solver episode (none by default)."""
        return []

    @abstractmethod
    def warmup_proposal(self, seed_task: Example, num_questions: int, rng: random.Random) -> str:
        """A templated, parseable proposer output for the supervised warm-up."""

    @abstractmethod
    def warmup_solution(self, task_config: dict[str, Any], rng: random.Random) -> str:
        """A templated solver turn for the warm-up (mixed quality on purpose, so that after the
        warm-up some questions are solved by some samples: the learnability band needs a spread)."""

    def warmup_solver_questions(
        self, questions: list[dict[str, Any]], seed_task: Example
    ) -> list[dict[str, Any]]:
        """The questions of a templated warm-up group as the warm-up's solver turns see them: the
        parsed group itself by default; a domain may rephrase them (the proposer's turn keeps the
        group as written)."""
        return questions

    def warmup_turns(self, task_config: dict[str, Any], rng: random.Random) -> list[str]:
        """The warm-up's solver turns for one episode, in order; a later turn is trained after the
        environment's reply to the earlier ones. One turn (:meth:`warmup_solution`) by default."""
        return [self.warmup_solution(task_config, rng)]
