"""``rlcr_two_turn``: seed 003's multi-turn rollout (prompt -> G_a answers -> G_c confidences each).

Turn 1 samples ``G_a`` answers per prompt and scores them (``acc_reward``); with
``rlcr.answer_decoding=greedy`` it decodes one argmax answer per prompt, scored but not trained
(its ``loss_mask`` is all zero), so only the confidence turn learns; ``greedy_and_sample`` decodes
that argmax answer first and ``G_a - 1`` sampled ones after it (only those are trained). Turn 2
puts each answer back into the conversation as the assistant turn, adds the confidence request, and
samples ``G_c`` confidences per answer; all (prompt, answer) pairs go into ONE generate call.
Rewards are fused into the batch (answer rows: accuracy; confidence rows: Brier against their own
answer's accuracy).
``rlcr.confidence_prefill`` starts every confidence reply in its context (parsed as prefill + reply).
``rlcr.confidence_decoding=enumerate`` samples no confidence: every candidate value is a row with the
backend's log-probs of writing it (``contracts.ScoresContinuations``), for the estimator's exact
expected-Brier advantages (decision 190); with ``rlcr.analyses_per_answer`` sampled analyses come
first and the candidates follow each (:mod:`nemo_azr.rlcr.analysis`, decision 199).
``rlcr.expected_confidence_readout`` keeps the sampled
confidences and records beside each the policy's expected confidence over the same candidates
(``expected_confidence`` meta, ``rlcr/expected_*`` metrics; decision 192).

Rows: ``sample_type`` answer | confidence, ``group_id`` = prompt, ``subgroup_id`` = answer,
``role`` = solver, ``loss_mask`` = the span masks ``M_ans`` / ``M_conf``. Answer rows come first,
then confidence rows; each kind is packed on its own and the two are stacked (right-padded), so the
short answer rows do not carry the long turn-2 prompt's padding.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

import torch

from nemo_azr.contracts import Batch, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.generation import (
    GenerationBackend,
    GenerationOutput,
    GenerationRequest,
    Sample,
    SamplingParams,
    ScoresContinuations,
)
from nemo_azr.contracts.task import Example, Task
from nemo_azr.errors import ConfigError
from nemo_azr.rlcr.advantages import RLCR_INFO_KEY
from nemo_azr.rlcr.analysis import analyses_then_candidates
from nemo_azr.rlcr.common import (
    ANSWER_CORRECT,
    CANDIDATE_OF,
    CONFIDENCE,
    ENUMERATED_FINISH,
    EXPECTED_CONFIDENCE,
    FORMAT_OK,
    GREEDY_ANSWER,
    HAS_CONFIDENCE,
    QUESTION_KIND,
    RowBuffer,
    calibration_step_metrics,
    confidence_candidate_texts,
    confidence_rows_kl_weight,
    continue_conversation,
    format_instruction,
    pad_id,
    question_kind,
    rlcr_settings,
    spread_fraction,
    turn_metrics,
    turn_suffix_ids,
)
from nemo_azr.rlcr.parsing import answer_format_ok, extract_answer_tag, parse_confidence
from nemo_azr.rlcr.rewards import answer_accuracy, brier_reward
from nemo_azr.rlcr.spans import answer_span_mask, confidence_span_mask
from nemo_azr.rlcr.warmup import answer_target, confidence_target
from nemo_azr.rollout.single_turn import encode_prompt

WARMUP_SEED_SALT = 4099
PROMPT_FIELDS = ("{question}", "{answer}")  # placeholders of rlcr.confidence_prompt


class TwoTurnRLCRWorkflow:
    def __init__(self, task: Task, tokenizer, cfg=None) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.settings = rlcr_settings(cfg)
        self.instruction = format_instruction(self.settings, single_turn=False)
        self.suffix_ids = turn_suffix_ids(tokenizer, self.settings.confidence_prompt)
        self._templated = any(k in self.settings.confidence_prompt for k in PROMPT_FIELDS)
        # rlcr.confidence_prefill: the start of the confidence reply, in the context (not generated)
        self.prefill = self.settings.confidence_prefill
        self.prefill_ids = (
            tokenizer(self.prefill, add_special_tokens=False)["input_ids"] if self.prefill else []
        )
        # rlcr.confidence_decoding=enumerate: the values written after the prefill, and their ids
        self.candidate_texts = confidence_candidate_texts(self.settings.confidence_candidates)
        self.candidate_ids = [
            tokenizer(t, add_special_tokens=False)["input_ids"] for t in self.candidate_texts
        ]
        seed = getattr(cfg, "seed", 0)
        self._warmup_rng = random.Random(seed + WARMUP_SEED_SALT)

    def _suffix(self, example: Example, answer_text: str) -> list[int]:
        """The confidence request's ids; ``{question}`` / ``{answer}`` in ``rlcr.confidence_prompt`` are
        replaced by the question and the answer as stated (its ``<answer>`` tag, else the reply)."""
        if not self._templated:
            return self.suffix_ids
        stated = extract_answer_tag(answer_text)
        answer = stated if stated is not None else answer_text.strip()
        text = self.settings.confidence_prompt.replace("{question}", example.question)
        return turn_suffix_ids(self.tokenizer, text.replace("{answer}", answer))

    def confidence_context(
        self, prompt_ids: list[int], answer_ids: list[int], example: Example, answer_text: str
    ) -> list[int]:
        """Turn 2's context: the conversation holding the answer, the confidence request, the prefill."""
        suffix = self._suffix(example, answer_text)
        return (
            continue_conversation(prompt_ids, answer_ids, suffix, self.tokenizer.eos_token_id)
            + self.prefill_ids
        )

    @property
    def rows_per_prompt(self) -> int:
        """Rows one prompt contributes: G_a answers + G_a x G_c confidences (G_c: the candidates when
        they are enumerated)."""
        g_a, g_c = self.settings.num_generations_answer, self.settings.num_generations_confidence
        if self.settings.confidence_decoding == "enumerate":
            g_c = len(self.candidate_texts)
            if self.settings.analyses_per_answer > 0:  # each analysis, then its candidates
                g_c = self.settings.analyses_per_answer * (1 + g_c)
        return g_a * (1 + g_c)

    def _accuracy(self, example: Example, text: str) -> float:
        s = self.settings
        return answer_accuracy(
            example.answer,
            text,
            answer_match=s.answer_match,
            qa_match=s.qa_match,
            f1_threshold=s.f1_threshold,
        )

    def run(
        self, examples: Sequence[Example], backend: GenerationBackend, sampling: SamplingParams, *, step: int
    ) -> Batch:
        s, tok = self.settings, self.tokenizer
        # --- turn 1: G_a answers per prompt ----------------------------------------------------
        prompt_ids = [
            encode_prompt(tok, self.task.messages(ex, instruction=self.instruction)) for ex in examples
        ]
        greedy_answers = s.answer_decoding == "greedy"
        answer_sampling = dataclasses.replace(
            sampling,
            n=s.num_generations_answer,
            max_new_tokens=s.answer_max_new_tokens or sampling.max_new_tokens,
            greedy=sampling.greedy or greedy_answers,
        )
        requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompt_ids)]
        if s.answer_decoding == "greedy_and_sample":
            turn1 = self._greedy_and_sampled_answers(backend, requests, answer_sampling)
        else:
            turn1 = backend.generate(requests, answer_sampling)
        # the first `untrained` answers of each prompt are argmax ones: scored, not trained
        untrained = {"greedy": s.num_generations_answer, "greedy_and_sample": 1}.get(s.answer_decoding, 0)
        # rlcr.greedy_answer_kl: their answer span joins the loss (advantage 0): only the KL term acts
        untrained_span = answer_span_mask if s.greedy_answer_kl else (lambda ids, _tok: [0] * len(ids))

        answers = RowBuffer()
        pairs = []  # (prompt index, group id, answer id, turn-2 context ids, accuracy)
        for i, (ex, out) in enumerate(zip(examples, turn1)):
            group = f"s{step}-p{i}"
            for k, sample in enumerate(out.samples):
                answer_id = f"{group}-a{k}"
                acc = self._accuracy(ex, sample.text)
                answers.add(
                    prompt_ids[i],
                    sample,
                    reward=acc,
                    # Greedy answers are not trained: an argmax token has no sampling log-prob at the
                    # training temperature, and one answer per prompt has no baseline to compare with.
                    span_mask=untrained_span(sample.token_ids, tok)
                    if k < untrained
                    else answer_span_mask(sample.token_ids, tok),
                    **{
                        F.UID: answer_id,
                        F.GROUP_ID: group,
                        F.SUBGROUP_ID: answer_id,
                        F.SAMPLE_TYPE: SampleType.ANSWER.value,
                        F.PROMPT_ID: ex.prompt_id,
                        F.POLICY_VERSION: out.policy_version,
                        F.PROMPT_TEXT: ex.question,
                        "example": ex,
                        ANSWER_CORRECT: acc,
                        CONFIDENCE: None,
                        EXPECTED_CONFIDENCE: None,
                        HAS_CONFIDENCE: False,
                        FORMAT_OK: answer_format_ok(sample.text),
                        GREEDY_ANSWER: k < untrained,
                        QUESTION_KIND: question_kind(ex),
                    },
                )
                context = self.confidence_context(prompt_ids[i], sample.token_ids, ex, sample.text)
                pairs.append((i, group, answer_id, context, acc))

        # --- turn 2: G_c confidences per answer, every (prompt, answer) pair in one call --------
        confidence_sampling = dataclasses.replace(
            sampling,
            n=s.num_generations_confidence,
            max_new_tokens=s.confidence_max_new_tokens or sampling.max_new_tokens,
        )
        # turn 2's rows, in buffers of one prompt layout each (packed apart, then stacked)
        if s.confidence_decoding == "enumerate" and s.analyses_per_answer > 0:
            analyses, candidates, metrics = analyses_then_candidates(
                self, examples, pairs, backend, confidence_sampling
            )
            metrics = {**self._metrics(answers, analyses), **metrics}
            turn2: list[RowBuffer] = [analyses, candidates]
        elif s.confidence_decoding == "enumerate":
            confidences, metrics = self._enumerate_confidences(
                examples, pairs, backend, confidence_sampling.temperature
            )
            metrics = {**self._metrics(answers, confidences), **metrics}
            confidences.meta[CANDIDATE_OF] = list(confidences.meta.get(F.SUBGROUP_ID, []))
            turn2 = [confidences]
        else:
            expected = None
            if s.expected_confidence_readout:
                expected = [
                    _expected_value(self.candidate_texts, w)
                    for w in self.candidate_weights(pairs, backend, confidence_sampling.temperature)[1]
                ]
            confidences = self._sample_confidences(
                examples, pairs, backend, confidence_sampling, expected=expected
            )
            metrics = self._metrics(answers, confidences)
            if expected is not None:
                metrics.update(_expected_metrics(expected, [acc for *_, acc in pairs]))
            turn2 = [confidences]

        # the two kinds' rows share keys: a turn-2 row carries whether its answer was an argmax one,
        # an answer row that it is no candidate
        answers.meta[CANDIDATE_OF] = [None] * len(answers.rewards)
        greedy_by_answer = dict(zip(answers.meta[F.UID], answers.meta[GREEDY_ANSWER]))
        for rows in turn2:
            rows.meta.setdefault(CANDIDATE_OF, [None] * len(rows.rewards))
            rows.meta[GREEDY_ANSWER] = [greedy_by_answer[a] for a in rows.meta.get(F.SUBGROUP_ID, [])]
        pad = pad_id(tok)
        batch = Batch.concat([answers.build(pad), *(rows.build(pad) for rows in turn2)])
        confidence_weight = confidence_rows_kl_weight(s)  # 1: every row alike, no weights needed
        if confidence_weight != 1.0:
            is_answer = [t == SampleType.ANSWER.value for t in batch.meta[F.SAMPLE_TYPE]]
            batch[F.KL_WEIGHT] = torch.tensor(
                [1.0 if a else confidence_weight for a in is_answer], dtype=torch.float32
            )
        batch.info = {
            "max_new_tokens": max(answer_sampling.max_new_tokens, confidence_sampling.max_new_tokens),
            RLCR_INFO_KEY: s,
            "metrics": metrics,
        }
        return batch

    @staticmethod
    def _greedy_and_sampled_answers(
        backend: GenerationBackend, requests: list[GenerationRequest], sampling: SamplingParams
    ) -> list[GenerationOutput]:
        """``rlcr.answer_decoding=greedy_and_sample``: per prompt the argmax answer first (the one a
        greedy evaluation asks the confidence about), then ``G_a - 1`` sampled ones, so the
        confidence turn trains on the answers it will be judged on and still sees right and wrong
        answers to one question side by side."""
        greedy = backend.generate(requests, dataclasses.replace(sampling, n=1, greedy=True))
        sampled = backend.generate(requests, dataclasses.replace(sampling, n=sampling.n - 1, greedy=False))
        return [dataclasses.replace(g, samples=[*g.samples, *o.samples]) for g, o in zip(greedy, sampled)]

    @staticmethod
    def confidence_meta(
        ex: Example,
        uid: str,
        group: str,
        answer_id: str,
        version: int,
        acc: float,
        c: float | None,
        expected: float | None = None,
    ) -> dict:
        """The meta of a turn-2 row: its ids, its answer's accuracy, the confidence ``c`` it states
        (None: not parsed) and the answer's ``expected`` confidence over the candidates (None: not
        scored)."""
        return {
            F.UID: uid,
            F.GROUP_ID: group,
            F.SUBGROUP_ID: answer_id,
            F.SAMPLE_TYPE: SampleType.CONFIDENCE.value,
            F.PROMPT_ID: ex.prompt_id,
            F.POLICY_VERSION: version,
            F.PROMPT_TEXT: ex.question,
            "example": ex,
            ANSWER_CORRECT: acc,
            CONFIDENCE: c,
            EXPECTED_CONFIDENCE: expected,  # the answer's, over the candidates (None: not scored)
            HAS_CONFIDENCE: True,
            FORMAT_OK: c is not None,
            QUESTION_KIND: question_kind(ex),
        }

    def _sample_confidences(
        self,
        examples: Sequence[Example],
        pairs: list,
        backend: GenerationBackend,
        sampling: SamplingParams,
        *,
        expected: Sequence[float] | None = None,
    ) -> RowBuffer:
        """Seed 003's turn 2: ``G_c`` sampled confidences per answer, rewarded by their Brier score.
        ``expected``: each answer's expected confidence (``rlcr.expected_confidence_readout``), kept
        on its confidence rows as meta; not part of the reward."""
        requests = [GenerationRequest(prompt_ids=ctx, request_id=aid) for _, _, aid, ctx, _ in pairs]
        confidences = RowBuffer()
        outputs = backend.generate(requests, sampling)
        for k, ((i, group, answer_id, context, acc), out) in enumerate(zip(pairs, outputs)):
            ex = examples[i]
            for h, sample in enumerate(out.samples):
                c = parse_confidence(self.prefill + sample.text)
                confidences.add(
                    context,
                    sample,
                    reward=brier_reward(acc, c),
                    span_mask=confidence_span_mask(sample.token_ids, self.tokenizer, prefill=self.prefill),
                    **self.confidence_meta(
                        ex,
                        f"{answer_id}-c{h}",
                        group,
                        answer_id,
                        out.policy_version,
                        acc,
                        c,
                        expected[k] if expected is not None else None,
                    ),
                )
        return confidences

    def candidate_weights(
        self, pairs: list, backend: GenerationBackend, temperature: float
    ) -> tuple[list[list[list[float]]], list[list[float]], list[float]]:
        """Each answer's candidate confidences scored after its turn-2 context: per answer the
        candidates' token log-probs, their probabilities renormalised over the candidates, and the
        probability mass the candidates hold before renormalising."""
        if not isinstance(backend, ScoresContinuations):
            raise ConfigError(
                "rlcr.confidence_decoding=enumerate and rlcr.expected_confidence_readout need a generation "
                f"backend that scores continuations (generation.backend=hf); {type(backend).__name__} does not"
            )
        scored = backend.continuation_logprobs(
            [ctx for _, _, _, ctx, _ in pairs], [self.candidate_ids] * len(pairs), temperature=temperature
        )
        weights, mass = [], []
        for per_candidate in scored:
            probs = [math.exp(sum(lp)) for lp in per_candidate]
            total = sum(probs)
            mass.append(total)
            weights.append([p / total for p in probs] if total > 0 else [1.0 / len(probs)] * len(probs))
        return scored, weights, mass

    def _enumerate_confidences(
        self, examples: Sequence[Example], pairs: list, backend: GenerationBackend, temperature: float
    ) -> tuple[RowBuffer, dict[str, float]]:
        """``rlcr.confidence_decoding=enumerate``: one row per candidate value per answer, carrying
        the policy's log-probs of writing it after the prefilled tag; the estimator weighs each by
        its probability (rlcr.advantages.expected_confidence_advantages). Nothing is sampled."""
        texts = self.candidate_texts
        ids = self.candidate_ids
        scored, all_weights, mass = self.candidate_weights(pairs, backend, temperature)
        confidences = RowBuffer()
        expected, expected_reward, correct = [], [], []
        for (i, group, answer_id, context, acc), per_candidate, weights in zip(pairs, scored, all_weights):
            ex = examples[i]
            expected.append(_expected_value(texts, weights))
            expected_reward.append(sum(w * brier_reward(acc, float(t)) for w, t in zip(weights, texts)))
            correct.append(acc)
            for h, (text, cand, logps) in enumerate(zip(texts, ids, per_candidate)):
                c = float(text)
                sample = Sample(
                    token_ids=list(cand), logprobs=list(logps), text=text, finish_reason=ENUMERATED_FINISH
                )
                confidences.add(
                    context,
                    sample,
                    reward=brier_reward(acc, c),
                    span_mask=[1] * len(cand),
                    **self.confidence_meta(
                        ex, f"{answer_id}-c{h}", group, answer_id, backend.version, acc, c, expected[-1]
                    ),
                )
        # per answer: the policy's expected confidence and expected Brier reward (over the candidates)
        metrics = calibration_step_metrics(expected, correct)
        metrics["rlcr/confidence_reward_mean"] = (
            sum(expected_reward) / len(expected_reward) if expected_reward else 0.0
        )
        metrics["rlcr/confidence_candidate_mass"] = sum(mass) / len(mass) if mass else 0.0
        metrics["rlcr/confidence_format_fail_frac"] = 0.0
        return confidences, metrics

    @staticmethod
    def _metrics(answers: RowBuffer, confidences: RowBuffer) -> dict[str, float]:
        a_meta, c_meta = answers.meta, confidences.meta
        metrics = {
            **turn_metrics("answer", answers.rewards, [len(r) for r in answers.responses]),
            **turn_metrics("confidence", confidences.rewards, [len(r) for r in confidences.responses]),
            "rlcr/accuracy": sum(a_meta[ANSWER_CORRECT]) / max(1, len(answers.rewards)),
            "rlcr/answer_groups_spread_frac": spread_fraction(answers.rewards, a_meta.get(F.GROUP_ID, [])),
            "rlcr/confidence_groups_spread_frac": spread_fraction(
                confidences.rewards, c_meta.get(F.SUBGROUP_ID, [])
            ),
            "rlcr/answer_format_fail_frac": _fail_frac(a_meta.get(FORMAT_OK, [])),
            "rlcr/confidence_format_fail_frac": _fail_frac(c_meta.get(FORMAT_OK, [])),
        }
        metrics.update(calibration_step_metrics(c_meta.get(CONFIDENCE, []), c_meta.get(ANSWER_CORRECT, [])))
        greedy = a_meta.get(GREEDY_ANSWER, [])
        if any(greedy) and not all(greedy):  # greedy_and_sample: how far apart the two kinds of answer are
            for name, want in (("greedy", True), ("sampled", False)):
                accs = [a for a, g in zip(a_meta[ANSWER_CORRECT], greedy) if g == want]
                metrics[f"rlcr/{name}_answer_accuracy"] = sum(accs) / len(accs)
        return metrics

    # --- supervised warm-up ------------------------------------------------------------------------
    def sft_pairs(self, examples: Sequence[Example]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, target ids + eos) for both turns of each example: a templated answer (some
        deliberately wrong) and, in the conversation that contains it, a templated confidence turn.
        ``rlcr.warmup_answer_turn=false``: the confidence turn's pair only."""
        tok, rng = self.tokenizer, self._warmup_rng
        pairs = []
        for ex in examples:
            prompt = encode_prompt(tok, self.task.messages(ex, instruction=self.instruction))
            answer = _target_ids(
                tok,
                answer_target(ex, rng, wrong_frac=self.settings.warmup_wrong_frac, pool=self.task.examples),
            )
            if self.settings.warmup_answer_turn:
                pairs.append((prompt, answer))
            context = self.confidence_context(
                prompt, answer, ex, tok.decode(answer, skip_special_tokens=True)
            )
            pairs.append((context, _target_ids(tok, confidence_target(rng, self.prefill))))
        return pairs


def _target_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def _expected_value(texts: Sequence[str], weights: Sequence[float]) -> float:
    """The candidates' values (their text, "0.3") averaged under their weights."""
    return sum(w * float(t) for w, t in zip(weights, texts))


def _expected_metrics(expected: Sequence[float], correct: Sequence[float]) -> dict[str, float]:
    """``rlcr.expected_confidence_readout``: the step's calibration numbers of the expected confidence
    (one per answer), under ``rlcr/expected_*`` beside the sampled confidences' ``rlcr/*``."""
    renamed = {}
    for key, value in calibration_step_metrics(expected, correct).items():
        if key in ("rlcr/confidence_mean", "rlcr/brier_score", "rlcr/confidence_auroc"):
            renamed["rlcr/expected_" + key.removeprefix("rlcr/")] = value
    return renamed


def _fail_frac(flags: Sequence[bool]) -> float:
    return sum(not f for f in flags) / len(flags) if flags else 0.0
