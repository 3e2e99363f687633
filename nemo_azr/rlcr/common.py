"""Pieces shared by the RLCR workflows: settings, turn-2 context, row assembly and step metrics."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nemo_azr.config.schema import RLCRConfig
from nemo_azr.contracts import Batch, Role
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.generation import Sample

#: Per-row meta the RLCR workflows add (besides the contract's ids): the answer's accuracy, the
#: parsed confidence (None: not parsed / no confidence on this row), whether the row has a
#: confidence turn (the rows that count for calibration) and the reward's parts.
ANSWER_CORRECT = "answer_correct"
CONFIDENCE = "confidence"
HAS_CONFIDENCE = "has_confidence"
#: two-turn, with enumerated candidates (rlcr.confidence_decoding=enumerate or
#: rlcr.expected_confidence_readout): the answer's expected confidence over the candidates
EXPECTED_CONFIDENCE = "expected_confidence"
FORMAT_OK = "format_ok"
#: two-turn answer rows: an argmax answer (rlcr.answer_decoding greedy / greedy_and_sample), not trained
GREEDY_ANSWER = "greedy_answer"
#: two-turn, enumerated candidates: the id of the context a candidate row is one of the candidates
#: in (its answer; with rlcr.analyses_per_answer its analysis), whose candidates share one expected
#: reward as baseline; None on every other row
CANDIDATE_OF = "candidate_of"
#: two-turn confidence rows: the question's kind (``Example.meta["kind"]``; None where the task has
#: none), the stratum of ``rlcr.candidate_baseline=kind``
QUESTION_KIND = "question_kind"
#: finish_reason of an enumerated candidate row: scored by the policy, not decoded (the samples
#: written by an evaluation carry it, so a reader can tell a candidate from the stated confidence)
ENUMERATED_FINISH = "enumerated"

#: Bins of the per-step confidence histogram (``rlcr/conf_hist_bin_k`` scalars).
CONF_HIST_BINS = 5
_SENTINEL = "\x00RLCR_ANSWER\x00"


#: ``rlcr.format_prompt=auto``: the exact output format, stated to the model (two-turn: turn 1 only;
#: the confidence request ``rlcr.confidence_prompt`` states turn 2's format).
ANSWER_TURN_FORMAT = (
    "Reason inside <think></think>, then write only the final answer inside <answer></answer>."
)
SINGLE_TURN_FORMAT = (
    "Reason inside <think></think>, write only the final answer inside <answer></answer>, then judge "
    "how likely your answer is right inside <analysis></analysis> and give that probability, a number "
    "from 0 to 1, inside <confidence></confidence>."
)
AUTO_FORMAT = "auto"


def format_instruction(settings: RLCRConfig, *, single_turn: bool) -> str:
    """The output-format instruction for the answer turn (or the single turn)."""
    if settings.format_prompt != AUTO_FORMAT:
        return settings.format_prompt
    return SINGLE_TURN_FORMAT if single_turn else ANSWER_TURN_FORMAT


def question_kind(example: Any) -> Any:
    """The example's ``meta["kind"]`` (None where its task gives none): the ``QUESTION_KIND`` meta."""
    return (example.meta or {}).get("kind")


def confidence_candidate_texts(values: Sequence[float]) -> list[str]:
    """``rlcr.confidence_candidates`` as the model would write them: one decimal ("0.3")."""
    return [f"{float(v):.1f}" for v in values]


def confidence_rows_kl_weight(settings: RLCRConfig) -> float:
    """The confidence rows' KL weight against the answer rows' 1: ``rlcr.confidence_kl_weight``, or 0
    with ``rlcr.confidence_kl=false`` (decisions 222-223)."""
    return settings.confidence_kl_weight if settings.confidence_kl else 0.0


def rlcr_settings(cfg: Any) -> RLCRConfig:
    """``cfg.rlcr`` of a full config, or the defaults (workflows may be built without a config)."""
    settings = getattr(cfg, "rlcr", None)
    return settings if isinstance(settings, RLCRConfig) else RLCRConfig()


def pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def turn_suffix_ids(tokenizer, user_message: str) -> list[int]:
    """Token ids that close an assistant turn and open the next user turn + generation prompt.

    Rendered by the tokenizer's own chat template around a sentinel assistant message, so the
    generated answer ids can be kept exactly as sampled (no re-tokenisation of the answer text).
    """
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": _SENTINEL},
        {"role": "user", "content": user_message},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    suffix = text[text.index(_SENTINEL) + len(_SENTINEL) :]
    return tokenizer(suffix, add_special_tokens=False)["input_ids"]


def continue_conversation(
    prompt_ids: Sequence[int], answer_ids: Sequence[int], suffix_ids: Sequence[int], eos_id: int | None
) -> list[int]:
    """Turn-2 context: the turn-1 prompt, the answer as generated (its trailing eos dropped, the
    suffix closes the turn), then the confidence request and the generation prompt."""
    answer = list(answer_ids)
    if answer and eos_id is not None and answer[-1] == eos_id:
        answer = answer[:-1]
    return [*prompt_ids, *answer, *suffix_ids]


@dataclass
class RowBuffer:
    """Collects rows of one kind (same prompt layout) and packs them into a :class:`Batch`."""

    prompts: list[list[int]] = field(default_factory=list)
    responses: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    masks: list[list[int] | None] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    meta: dict[str, list[Any]] = field(default_factory=dict)

    def add(
        self,
        prompt_ids: list[int],
        sample: Sample,
        *,
        reward: float,
        span_mask: list[int] | None,
        **meta: Any,
    ) -> None:
        self.prompts.append(prompt_ids)
        self.responses.append(sample.token_ids)
        self.logprobs.append(sample.logprobs)
        self.masks.append(span_mask)
        self.rewards.append(float(reward))
        meta.setdefault(F.ROLE, Role.SOLVER.value)
        meta.setdefault(F.RESPONSE_TEXT, sample.text)
        meta.setdefault("finish_reason", sample.finish_reason)
        for key, value in meta.items():
            self.meta.setdefault(key, []).append(value)

    def build(self, pad: int) -> Batch:
        """``[left-padded prompt | right-padded response]``; ``loss_mask`` = the span masks when given."""
        if not self.prompts:
            return Batch()
        tensors = pack_prompt_response(self.prompts, self.responses, self.logprobs, pad_id=pad)
        width = max(len(p) for p in self.prompts)
        loss_mask = tensors[F.LOSS_MASK]
        for i, mask in enumerate(self.masks):
            if mask is not None:  # span mask on the response columns; prompt columns stay 0
                loss_mask[i, width : width + len(mask)] = torch.as_tensor(mask, dtype=loss_mask.dtype)
        tensors[F.REWARDS] = torch.tensor(self.rewards, dtype=torch.float32)
        return Batch(tensors, {k: list(v) for k, v in self.meta.items()})


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    t = torch.tensor(values, dtype=torch.float64)
    return float(t.mean()), float(t.std(unbiased=False))


def spread_fraction(rewards: Sequence[float], group_ids: Sequence[Any]) -> float:
    """Fraction of groups whose rewards are not all equal (groups with a learning signal)."""
    groups: dict[Any, list[float]] = {}
    for r, g in zip(rewards, group_ids):
        groups.setdefault(g, []).append(r)
    if not groups:
        return 0.0
    return sum(max(v) != min(v) for v in groups.values()) / len(groups)


def confidence_histogram(confidences: Sequence[float | None], bins: int = CONF_HIST_BINS) -> dict[str, float]:
    """Share of parsed confidences in each of ``bins`` equal-width bins of [0, 1] (``rlcr/conf_hist_bin_k``)."""
    parsed = [c for c in confidences if c is not None]
    counts = [0] * bins
    for c in parsed:
        counts[min(int(c * bins), bins - 1)] += 1
    total = max(1, len(parsed))
    return {f"rlcr/conf_hist_bin_{k}": counts[k] / total for k in range(bins)}


def turn_metrics(prefix: str, rewards: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
    mean, std = _mean_std(rewards)
    length_mean, _ = _mean_std([float(n) for n in lengths])
    return {
        f"rlcr/{prefix}_reward_mean": mean,
        f"rlcr/{prefix}_reward_std": std,
        f"rlcr/{prefix}_length_mean": length_mean,
    }


def calibration_step_metrics(
    confidences: Sequence[float | None], correct: Sequence[float]
) -> dict[str, float]:
    """Mean parsed confidence, its Brier score against the answers' accuracy, its AUROC as a score of
    correctness (``rlcr/confidence_auroc``: present when the step has right and wrong answers) and
    the histogram."""
    from nemo_azr.rlcr.calibration import auroc

    pairs = [(c, y) for c, y in zip(confidences, correct) if c is not None]
    out = confidence_histogram(confidences)
    out["rlcr/confidence_mean"] = sum(c for c, _ in pairs) / len(pairs) if pairs else 0.0
    out["rlcr/brier_score"] = sum((c - y) ** 2 for c, y in pairs) / len(pairs) if pairs else 1.0
    if len({y for _, y in pairs}) == 2:
        out["rlcr/confidence_auroc"] = auroc([c for c, _ in pairs], [y for _, y in pairs])
    return out
