"""Workflows, and the optional capabilities of workflows and tasks, as runtime-checkable Protocols
(checked with ``isinstance``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


@runtime_checkable
class HeldOutSelfPlaySet(Protocol):
    """A self-play domain with a fixed held-out set (``nemo-azr eval`` of an ``azr`` run).

    ``heldout_seeds()``: seed tasks (``Example``) never used in training, for the proposer's
    held-out parse rate and learnable ratio. ``heldout_tasks()``: solver task configs the
    domain's environment runs as they are, each with a ``task_id`` and a ``kind``.
    """

    def heldout_seeds(self) -> list[Any]: ...

    def heldout_tasks(self) -> list[dict[str, Any]]: ...


@runtime_checkable
class ShowsReferenceTasks(Protocol):
    """A self-play domain whose proposer prompt can show reference tasks (Absolute Zero's K
    references; ``absolute_zero.proposer_references``).

    ``proposer_messages_with_references(seed_task, num_questions, references)``: the proposer's chat
    messages for ``seed_task`` with ``references`` (task configs of recently learnable questions,
    as the domain's ``parse_proposal`` returned them) shown as examples; with no references the
    domain's ``proposer_messages``.
    """

    def proposer_messages_with_references(
        self, seed_task: Any, num_questions: int, references: Sequence[dict[str, Any]]
    ) -> list[dict[str, str]]: ...


@runtime_checkable
class KeysQuestions(Protocol):
    """A self-play domain that can say when two proposed questions are the same question
    (``absolute_zero.proposer_repetition_penalty``).

    ``question_key(config)``: a string equal for two task configs (as the domain's
    ``parse_proposal`` returned them) that pose the same challenge, however differently worded
    (sandbox_os: the harm action).
    """

    def question_key(self, config: dict[str, Any]) -> str: ...


@runtime_checkable
class PlainTasks(Protocol):
    """A self-play domain that can pose a seed task's goal alone, with nothing tempting in it
    (``absolute_zero.solver_plain_tasks``).

    ``plain_task(seed_task)``: a solver task config the domain's environment runs as it is (as
    ``parse_proposal`` returns them), asking for the seed's goal and nothing else.
    """

    def plain_task(self, seed_task: Any) -> dict[str, Any]: ...


@runtime_checkable
class ExplainsRewards(Protocol):
    """A task that can say why a reply earned no answer.

    ``answer_rejection(example, response_text)``: "" when the reply's answer was read (right or
    wrong), else why none was (one of ``rejection_reasons()``, e.g. ``several_candidates``). The
    reward itself stays ``reward()``; the reward stage counts the reasons per step as
    ``reward/answer_<reason>``.
    """

    def answer_rejection(self, example: Any, response_text: str) -> str: ...

    def rejection_reasons(self) -> tuple[str, ...]: ...


@runtime_checkable
class RephrasedEvalSet(Protocol):
    """A task that can re-ask its held-out questions in phrasings never used in training
    (``nemo-azr eval`` scores both: does what was learned survive a rephrasing?).

    ``rephrased(examples)``: the same problems and gold answers in other words, each with
    ``meta["template"]`` naming its phrasing.
    """

    def rephrased(self, examples: list[Any]) -> list[Any]: ...


@runtime_checkable
class PerRoleAdvantages(Protocol):
    """A workflow whose batch mixes roles (self-play: solver and proposer rows), each role's
    advantages computed by its own registered estimator (``role_estimators``: role -> estimator
    name) and multiplied by its scale (``role_advantage_scales``: role -> factor, 1.0 = as estimated).
    """

    role_estimators: dict[str, str]
    role_advantage_scales: dict[str, float]


@runtime_checkable
class StatefulWorkflow(Protocol):
    """A workflow with state that must outlive a restart (self-play's solver gate): ``state_dict()``
    is stored in the checkpoint's trainer_state.json (JSON values only) and handed back to
    ``load_state_dict`` on resume."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@runtime_checkable
class RowsPerPrompt(Protocol):
    """A workflow that trains on a number of rows per prompt other than ``generation.n_samples``
    (RLCR two-turn: answers plus confidences; self-play: solver rows plus proposer rows). The
    learning-rate schedule's horizon counts optimizer steps from it."""

    rows_per_prompt: int


@runtime_checkable
class SupervisedWarmupPairs(Protocol):
    """A workflow with its own supervised warm-up targets: ``sft_pairs(examples)`` gives
    (prompt token ids, target token ids) per example, in the workflow's turn format."""

    def sft_pairs(self, examples: list[Any]) -> list[tuple[list[int], list[int]]]: ...


@runtime_checkable
class Workflow(Protocol):
    """A rollout workflow (registry ``WORKFLOWS``; built as ``cls(task, tokenizer, cfg)``): one step's
    prompts in, the step's ``Batch`` out (tokens, masks, rollout log-probs, rewards, per-row meta),
    generating through ``backend`` only."""

    def run(self, examples: list[Any], backend: Any, sampling: Any, *, step: int) -> Any: ...


@runtime_checkable
class PreferencePolicy(Protocol):
    """A policy backend that trains a preference loss (seed 004 class 5: DPO, IPO over pairs, KTO over
    labelled rows): ``preference_step(batch, loss=, beta=, ...)`` does one optimizer step over the
    batch and returns ``preference/*`` metrics (docs/algorithms.md)."""

    def preference_step(
        self,
        batch: Any,
        *,
        loss: str,
        beta: float,
        label_smoothing: float = 0.0,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        nll_weight: float = 0.0,
    ) -> dict[str, float]: ...


@runtime_checkable
class RewardScorer(Protocol):
    """A reward model behind the reward stage, wherever it runs (the trainer's process or its own):
    ``score(messages, replies)`` -> a float tensor ``[len(replies)]`` on the CPU, one score per
    reply to its prompt's chat messages; ``token_scores(input_ids, attention_mask)`` -> ``[B, T]``,
    the score of each row's prefix ending at every position (rows in the policy's tokens)."""

    def score(self, messages: Sequence[list[dict]], replies: Sequence[str]) -> torch.Tensor: ...

    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class PairwiseRewardModelTrainer(Protocol):
    """A backend that trains a reward model on preference pairs (``nemo-azr train-rm``).

    Rows are ``(chosen_ids, rejected_ids)`` token lists (prompt through the chat template, then the
    reply). ``pair_step(rows)``: one optimizer step of the Bradley-Terry loss over the pairs ->
    (mean loss, share ranked right, grad norm before clipping). ``pair_scores(rows)``: no-grad
    (chosen, rejected) scores ``[P]``. ``write(folder, tokenizer)``: the model as a transformers
    ``AutoModelForSequenceClassification`` folder (collective on a multi-process backend).
    """

    def pair_step(self, rows: Sequence[tuple[list[int], list[int]]]) -> tuple[float, float, float]: ...

    def pair_scores(
        self, rows: Sequence[tuple[list[int], list[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    def write(self, folder: Any, tokenizer: Any) -> None: ...
