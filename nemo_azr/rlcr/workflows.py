"""Registers the RLCR rollout workflows: ``rlcr_two_turn``, ``rlcr_single_turn`` and ``rlcr``
(which of the two follows ``rlcr.multi_turn``)."""

from __future__ import annotations

from nemo_azr.contracts.task import Task
from nemo_azr.registry import WORKFLOWS
from nemo_azr.rlcr.common import rlcr_settings
from nemo_azr.rlcr.single_turn import SingleTurnRLCRWorkflow
from nemo_azr.rlcr.two_turn import TwoTurnRLCRWorkflow

RLCR_WORKFLOWS = ("rlcr", "rlcr_two_turn", "rlcr_single_turn")

WORKFLOWS.register("rlcr_two_turn")(TwoTurnRLCRWorkflow)
WORKFLOWS.register("rlcr_single_turn")(SingleTurnRLCRWorkflow)


@WORKFLOWS.register("rlcr")
def rlcr_workflow(task: Task, tokenizer, cfg=None) -> TwoTurnRLCRWorkflow | SingleTurnRLCRWorkflow:
    """The multi-turn switch: two turns when ``rlcr.multi_turn`` is true, else the single turn."""
    cls = TwoTurnRLCRWorkflow if rlcr_settings(cfg).multi_turn else SingleTurnRLCRWorkflow
    return cls(task, tokenizer, cfg)


def is_two_turn(workflow: str, multi_turn: bool) -> bool:
    """Whether the workflow name (with the switch) selects the two-turn rollout."""
    return workflow == "rlcr_two_turn" or (workflow == "rlcr" and multi_turn)
