"""``rlcr_single_turn``: the RLCR paper's form, one turn with think / answer / analysis / confidence.

Reward (fused into the batch): ``format_weight * format + accuracy_weight * acc +
brier_weight * brier_reward(acc, c)``; the estimator (``grpo`` in the experiment) supplies the
group-mean baseline over the ``generation.n_samples`` responses of a prompt. The whole response is
trained (``loss_mask`` = all generated tokens), as in the paper.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from nemo_azr.contracts import Batch, SampleType
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, SamplingParams
from nemo_azr.contracts.task import Example, Task
from nemo_azr.rlcr.advantages import RLCR_INFO_KEY
from nemo_azr.rlcr.common import (
    ANSWER_CORRECT,
    CONFIDENCE,
    FORMAT_OK,
    HAS_CONFIDENCE,
    RowBuffer,
    calibration_step_metrics,
    format_instruction,
    pad_id,
    rlcr_settings,
    spread_fraction,
    turn_metrics,
)
from nemo_azr.rlcr.rewards import single_turn_reward
from nemo_azr.rlcr.warmup import answer_target, confidence_target
from nemo_azr.rollout.single_turn import encode_prompt

WARMUP_SEED_SALT = 4099


class SingleTurnRLCRWorkflow:
    def __init__(self, task: Task, tokenizer, cfg=None) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.settings = rlcr_settings(cfg)
        self.instruction = format_instruction(self.settings, single_turn=True)
        generation = getattr(cfg, "generation", None)
        self.rows_per_prompt = generation.n_samples if generation is not None else 1
        self._warmup_rng = random.Random(getattr(cfg, "seed", 0) + WARMUP_SEED_SALT)

    def run(
        self, examples: Sequence[Example], backend: GenerationBackend, sampling: SamplingParams, *, step: int
    ) -> Batch:
        s, tok = self.settings, self.tokenizer
        prompt_ids = [
            encode_prompt(tok, self.task.messages(ex, instruction=self.instruction)) for ex in examples
        ]
        requests = [GenerationRequest(prompt_ids=p, request_id=i) for i, p in enumerate(prompt_ids)]
        outputs = backend.generate(requests, sampling)

        rows = RowBuffer()
        parts = []
        for i, (ex, out) in enumerate(zip(examples, outputs)):
            group = f"s{step}-p{i}"
            for j, sample in enumerate(out.samples):
                r = single_turn_reward(
                    ex.answer,
                    sample.text,
                    format_weight=s.format_weight,
                    accuracy_weight=s.accuracy_weight,
                    brier_weight=s.brier_weight,
                    answer_match=s.answer_match,
                    qa_match=s.qa_match,
                    f1_threshold=s.f1_threshold,
                )
                parts.append(r)
                uid = f"{group}-r{j}"
                rows.add(
                    prompt_ids[i],
                    sample,
                    reward=r.total,
                    span_mask=None,  # the whole response is trained
                    **{
                        F.UID: uid,
                        F.GROUP_ID: group,
                        F.SUBGROUP_ID: uid,
                        F.SAMPLE_TYPE: SampleType.ANSWER.value,
                        F.PROMPT_ID: ex.prompt_id,
                        F.POLICY_VERSION: out.policy_version,
                        F.PROMPT_TEXT: ex.question,
                        "example": ex,
                        ANSWER_CORRECT: r.accuracy,
                        CONFIDENCE: r.confidence,
                        HAS_CONFIDENCE: True,
                        FORMAT_OK: r.format_ok,
                    },
                )

        batch = rows.build(pad_id(tok))
        metrics = {
            **turn_metrics("single", rows.rewards, [len(r) for r in rows.responses]),
            "rlcr/accuracy": sum(p.accuracy for p in parts) / max(1, len(parts)),
            "rlcr/brier_reward_mean": sum(p.brier for p in parts) / max(1, len(parts)),
            "rlcr/groups_spread_frac": spread_fraction(rows.rewards, rows.meta.get(F.GROUP_ID, [])),
            "rlcr/format_fail_frac": sum(not p.format_ok for p in parts) / max(1, len(parts)),
            "rlcr/confidence_parse_fail_frac": sum(p.confidence is None for p in parts) / max(1, len(parts)),
        }
        metrics.update(calibration_step_metrics([p.confidence for p in parts], [p.accuracy for p in parts]))
        batch.info = {"max_new_tokens": sampling.max_new_tokens, RLCR_INFO_KEY: s, "metrics": metrics}
        return batch

    def sft_pairs(self, examples: Sequence[Example]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, target ids + eos): templated think/answer (some wrong) + analysis/confidence."""
        tok, rng = self.tokenizer, self._warmup_rng
        pairs = []
        for ex in examples:
            prompt = encode_prompt(tok, self.task.messages(ex, instruction=self.instruction))
            text = answer_target(ex, rng, wrong_frac=self.settings.warmup_wrong_frac, pool=self.task.examples)
            text += confidence_target(rng)
            pairs.append((prompt, tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]))
        return pairs
