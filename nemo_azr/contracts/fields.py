"""Canonical batch field names, per-row meta names and the role / sample-type vocabularies.

Layout convention (one for the whole project): every per-token tensor is ``[B, T]`` and aligned
with ``input_ids``: column ``t`` of ``old_logprobs`` is ``log p(input_ids[:, t] | input_ids[:, :t])``
(column 0 is 0). Padding may sit on either side; ``attention_mask`` marks real tokens and
``loss_mask`` marks the tokens that receive gradient (model-generated tokens only).
"""

from __future__ import annotations

from enum import Enum

# --- tensors -------------------------------------------------------------------------------------
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOSS_MASK = "loss_mask"
ROLLOUT_LOGPROBS = "rollout_logprobs"
OLD_LOGPROBS = "old_logprobs"
REF_LOGPROBS = "ref_logprobs"
VALUES = "values"
REWARDS = "rewards"  # [B]
BASELINE_REWARDS = "baseline_rewards"  # [B], e.g. ReMax's greedy-rollout reward
# [B] float, optional: the temperature a row was sampled at, where rows differ (self-play's
# absolute_zero.proposer_temperature); log-probs of that row are taken at it. Absent: generation.temperature.
SAMPLING_TEMPERATURE = "sampling_temperature"
TOKEN_REWARDS = "token_rewards"
ADVANTAGES = "advantages"
RETURNS = "returns"
#: [B] float, optional: each row's multiplier of the KL term (``algorithm.kl``; absent = 1 for every
#: row). 0 leaves a row's tokens out of the KL term; a row whose advantage is 0 and weight 1 is held
#: near the reference by the KL term alone
KL_WEIGHT = "kl_weight"
#: [B] preference data: 1 = chosen / desirable response, 0 = rejected / undesirable
PREFERENCE_LABEL = "preference_label"

#: Tensors whose second dimension is the sequence; ``Batch.concat`` right-pads them to one length.
TOKEN_LEVEL_KEYS = frozenset(
    {
        INPUT_IDS,
        ATTENTION_MASK,
        POSITION_IDS,
        LOSS_MASK,
        ROLLOUT_LOGPROBS,
        OLD_LOGPROBS,
        REF_LOGPROBS,
        VALUES,
        TOKEN_REWARDS,
        ADVANTAGES,
        RETURNS,
    }
)

# --- per-row meta --------------------------------------------------------------------------------
UID = "uid"
GROUP_ID = "group_id"
SUBGROUP_ID = "subgroup_id"
ROLE = "role"
SAMPLE_TYPE = "sample_type"
PROMPT_ID = "prompt_id"
QUESTION_ID = "question_id"
POLICY_VERSION = "policy_version"
PROMPT_TEXT = "prompt_text"
RESPONSE_TEXT = "response_text"
PAIR_ID = "pair_id"  # preference pairs: the chosen and the rejected row of one pair share it
#: KTO: True on a mismatched row (one example's prompt, another's response) that only estimates the
#: reference point KL(pi || ref); its preference_label is not read
KL_ROW = "kl_row"


class Role(str, Enum):
    SOLVER = "solver"
    PROPOSER = "proposer"


class SampleType(str, Enum):
    ANSWER = "answer"
    CONFIDENCE = "confidence"
    PROPOSAL = "proposal"
