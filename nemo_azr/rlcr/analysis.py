"""``rlcr.analyses_per_answer``: the confidence turn analyses the answer before it states a confidence.

The RLCR paper's reply holds an ``<analysis>`` before its ``<confidence>``: the model looks at its
answer again before it commits to a number. Here, with ``rlcr.confidence_decoding=enumerate``, turn 2
becomes two stages (decision 199):

1. ``N`` analyses are sampled per answer, each after the conversation and the prefilled
   ``<analysis>`` tag, up to ``</analysis>`` (a stop string) or the turn's length limit;
2. after each analysis (closed with ``</analysis>`` when the model did not close it) and the
   prefilled ``<confidence>`` tag, every candidate confidence is a row with the policy's log-probs
   of writing it, as in plain enumeration.

Rows and advantages:

- analysis rows (``sample_type`` confidence, ``candidate_of`` None): the analysis tokens, rewarded
  with the expected Brier reward of the confidences that follow it (``sum_c w_c R_c``); their
  advantages are normalised over the answer's ``N`` analyses (``subgroup_id`` = the answer), as
  sampled confidences are: an analysis that makes the confidence after it better calibrated is
  reinforced against the answer's other analyses;
- candidate rows (``candidate_of`` = the analysis): ``w_c (R_c - sum w R)`` over the candidates
  after that analysis (:func:`nemo_azr.rlcr.advantages.expected_confidence_advantages`).

What the model states after an analysis (``confidence`` of the analysis row) is its likeliest
candidate, what greedy decoding writes; ``expected_confidence`` is the mean under the candidates'
probabilities. The warm-up is unchanged: its confidence pairs already teach the number after the
``<confidence>`` tag, which is where each candidate goes here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from nemo_azr.contracts import fields as F
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, Sample, SamplingParams
from nemo_azr.contracts.task import Example
from nemo_azr.rlcr.common import (
    CANDIDATE_OF,
    ENUMERATED_FINISH,
    HAS_CONFIDENCE,
    RowBuffer,
    calibration_step_metrics,
    spread_fraction,
)
from nemo_azr.rlcr.parsing import ANALYSIS_CLOSE, ANALYSIS_OPEN
from nemo_azr.rlcr.rewards import brier_reward

__all__ = ["analysis_context", "analyses_then_candidates"]


def analysis_context(context: list[int], prefill_ids: list[int], analysis_open_ids: list[int]) -> list[int]:
    """The analysis's context: turn 2's context with the ``<analysis>`` tag in place of the
    ``<confidence>`` prefill (``context`` ends with ``prefill_ids``)."""
    base = context[: len(context) - len(prefill_ids)] if prefill_ids else list(context)
    return [*base, *analysis_open_ids]


def _candidate_context(
    context: list[int], sample: Sample, eos_id: int | None, close_ids: list[int], prefill_ids: list[int]
) -> list[int]:
    """After the analysis as generated (its eos dropped, closed when the model did not close it),
    the ``<confidence>`` prefill: where each candidate value is scored."""
    ids = list(sample.token_ids)
    if ids and eos_id is not None and ids[-1] == eos_id:
        ids = ids[:-1]
    closing = [] if ANALYSIS_CLOSE in sample.text else close_ids
    return [*context, *ids, *closing, *prefill_ids]


def analyses_then_candidates(
    workflow: Any,  # TwoTurnRLCRWorkflow (which imports this module)
    examples: Sequence[Example],
    pairs: list,
    backend: GenerationBackend,
    sampling: SamplingParams,
) -> tuple[RowBuffer, RowBuffer, dict[str, float]]:
    """Turn 2 of ``rlcr.analyses_per_answer`` > 0: (analysis rows, candidate rows, step metrics).

    ``workflow`` is the :class:`~nemo_azr.rlcr.two_turn.TwoTurnRLCRWorkflow` (its tokenizer, prefill,
    candidates and their scoring); ``pairs`` its turn-1 answers ``(prompt index, group, answer id,
    turn-2 context, accuracy)``; ``sampling`` the confidence turn's (temperature, length limit)."""
    tok, settings = workflow.tokenizer, workflow.settings
    open_ids = tok(ANALYSIS_OPEN, add_special_tokens=False)["input_ids"]
    close_ids = tok(ANALYSIS_CLOSE, add_special_tokens=False)["input_ids"]
    contexts = [analysis_context(ctx, workflow.prefill_ids, open_ids) for _, _, _, ctx, _ in pairs]
    analysis_sampling = dataclasses.replace(
        sampling,
        n=settings.analyses_per_answer,
        stop_strings=tuple(dict.fromkeys([*sampling.stop_strings, ANALYSIS_CLOSE])),
    )
    outputs = backend.generate(
        [
            GenerationRequest(prompt_ids=ctx, request_id=aid)
            for ctx, (_, _, aid, _, _) in zip(contexts, pairs)
        ],
        analysis_sampling,
    )
    # every analysis, then the candidates after it: one scoring call for all of them
    analyses = []  # (pair, analysis context, sample, its policy version, analysis id, candidate context)
    for pair, ctx, out in zip(pairs, contexts, outputs):
        for h, sample in enumerate(out.samples):
            cand_ctx = _candidate_context(ctx, sample, tok.eos_token_id, close_ids, workflow.prefill_ids)
            analyses.append((pair, ctx, sample, out.policy_version, f"{pair[2]}-n{h}", cand_ctx))
    scored, all_weights, mass = workflow.candidate_weights(
        [(None, None, None, cand_ctx, None) for *_, cand_ctx in analyses], backend, sampling.temperature
    )

    texts, values = workflow.candidate_texts, [float(t) for t in workflow.candidate_texts]
    analysis_rows, candidate_rows = RowBuffer(), RowBuffer()
    expected_by_answer: dict[str, list[float]] = {}
    correct_by_answer: dict[str, float] = {}
    analysis_rewards, closed = [], []
    for (pair, ctx, sample, version, analysis_id, cand_ctx), per_candidate, weights in zip(
        analyses, scored, all_weights
    ):
        i, group, answer_id, _, acc = pair
        ex = examples[i]
        rewards = [brier_reward(acc, v) for v in values]
        expected = sum(w * v for w, v in zip(weights, values))
        stated = values[max(range(len(weights)), key=weights.__getitem__)]
        expected_reward = sum(w * r for w, r in zip(weights, rewards))
        expected_by_answer.setdefault(answer_id, []).append(expected)
        correct_by_answer[answer_id] = acc
        analysis_rewards.append(expected_reward)
        closed.append(ANALYSIS_CLOSE in sample.text)
        analysis_rows.add(
            ctx,
            sample,
            reward=expected_reward,
            span_mask=[1] * len(sample.token_ids),
            **workflow.confidence_meta(ex, analysis_id, group, answer_id, version, acc, stated, expected),
            **{CANDIDATE_OF: None},
        )
        for h, (text, cand, logps) in enumerate(zip(texts, workflow.candidate_ids, per_candidate)):
            candidate = Sample(
                token_ids=list(cand), logprobs=list(logps), text=text, finish_reason=ENUMERATED_FINISH
            )
            meta = workflow.confidence_meta(
                ex, f"{analysis_id}-c{h}", group, answer_id, backend.version, acc, values[h], expected
            )
            meta[HAS_CONFIDENCE] = False  # a candidate, not a statement: the analysis row states it
            candidate_rows.add(
                cand_ctx,
                candidate,
                reward=rewards[h],
                span_mask=[1] * len(cand),
                **meta,
                **{CANDIDATE_OF: analysis_id},
            )

    # per answer: the mean over its analyses of the expected confidence after each
    answer_ids = list(expected_by_answer)
    metrics = calibration_step_metrics(
        [sum(v) / len(v) for v in expected_by_answer.values()], [correct_by_answer[a] for a in answer_ids]
    )
    n = len(analysis_rewards)
    metrics["rlcr/confidence_reward_mean"] = sum(analysis_rewards) / n if n else 0.0
    metrics["rlcr/confidence_candidate_mass"] = sum(mass) / len(mass) if mass else 0.0
    metrics["rlcr/confidence_format_fail_frac"] = 0.0
    metrics["rlcr/analysis_length_mean"] = sum(len(r) for r in analysis_rows.responses) / n if n else 0.0
    metrics["rlcr/analysis_closed_frac"] = sum(closed) / n if n else 0.0
    # answers whose analyses lead to different expected rewards: the analyses' learning signal
    metrics["rlcr/analysis_groups_spread_frac"] = spread_fraction(
        analysis_rewards, analysis_rows.meta.get(F.SUBGROUP_ID, [])
    )
    return analysis_rows, candidate_rows, metrics
