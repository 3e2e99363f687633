"""RLCR (seed 003): answer + confidence training with a Brier reward and hierarchical advantages.

Importing this package registers the ``rlcr_two_turn``, ``rlcr_single_turn`` and ``rlcr`` workflows
and the ``rlcr_hierarchical`` advantage estimator.
"""

from nemo_azr.rlcr.advantages import (
    RLCR_INFO_KEY,
    answer_advantages,
    confidence_advantages,
    group_normalize,
    rlcr_hierarchical,
)
from nemo_azr.rlcr.calibration import (
    auroc,
    auroc_standard_error,
    calibration_metrics,
    plot_reliability_diagram,
    reliability_bins,
)
from nemo_azr.rlcr.parsing import (
    answer_format_ok,
    confidence_format_ok,
    extract_answer_tag,
    parse_confidence,
    single_turn_format_ok,
)
from nemo_azr.rlcr.rewards import answer_accuracy, brier_reward, single_turn_reward, token_f1
from nemo_azr.rlcr.single_turn import SingleTurnRLCRWorkflow
from nemo_azr.rlcr.spans import answer_span_mask, confidence_span_mask, find_span, token_char_offsets
from nemo_azr.rlcr.two_turn import TwoTurnRLCRWorkflow
from nemo_azr.rlcr.workflows import RLCR_WORKFLOWS, is_two_turn

__all__ = [
    "RLCR_INFO_KEY",
    "RLCR_WORKFLOWS",
    "SingleTurnRLCRWorkflow",
    "TwoTurnRLCRWorkflow",
    "answer_accuracy",
    "answer_advantages",
    "answer_format_ok",
    "answer_span_mask",
    "auroc",
    "auroc_standard_error",
    "brier_reward",
    "calibration_metrics",
    "confidence_advantages",
    "confidence_format_ok",
    "confidence_span_mask",
    "extract_answer_tag",
    "find_span",
    "group_normalize",
    "is_two_turn",
    "parse_confidence",
    "plot_reliability_diagram",
    "reliability_bins",
    "rlcr_hierarchical",
    "single_turn_format_ok",
    "single_turn_reward",
    "token_char_offsets",
    "token_f1",
]
