"""Stage-gated batch validation: each stage names the keys it needs and their shapes.

``validate_batch(batch, "advantage")`` raises a :class:`BatchContractError` that names the stage,
the key and what was expected, e.g.
``stage 'advantage': key 'rewards' must be [B] float, got [8, 3] float32``.
Stages are cumulative: a batch entering ``update`` must also satisfy ``rollout`` and ``reward``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from nemo_azr.contracts import fields as F
from nemo_azr.contracts.batch import Batch
from nemo_azr.errors import BatchContractError

STAGES = ("rollout", "reward", "advantage", "update")
#: ``batch.info`` flag: the update takes old log-probs from its own forward pass (a single on-policy
#: optimizer step, where they equal the current log-probs), so ``old_logprobs`` is not required.
OLD_LOGPROBS_FROM_UPDATE = "old_logprobs_from_update"
#: ``batch.info`` entry a workflow may set: ``{prompt_id: value in [0, 1]}``, how useful each prompt's
#: rollout was to train on (self-play: 1 when its question group reached the learnability band). A
#: curriculum prompt loader (``data.curriculum=feedback``) samples prompts by it.
PROMPT_FEEDBACK = "prompt_feedback"
#: ``batch.info`` entry a workflow may set: ``{role: factor}``, this step's extra multiplier on a role's
#: advantages (per-role estimators only; the run's own scales still apply). 0 keeps the role's rows in
#: the update with no policy-gradient term, so only the KL term moves them (self-play's solver gate).
STEP_ROLE_ADVANTAGE_SCALES = "step_role_advantage_scales"


@dataclass(frozen=True)
class TensorSpec:
    key: str
    dims: str  # "B" or "B,T"
    kind: str  # "int" | "float" | "mask"

    def describe(self) -> str:
        return f"[{self.dims}] {self.kind}"


@dataclass(frozen=True)
class MetaSpec:
    key: str


STAGE_SPECS: dict[str, tuple[TensorSpec | MetaSpec, ...]] = {
    "rollout": (
        TensorSpec(F.INPUT_IDS, "B,T", "int"),
        TensorSpec(F.ATTENTION_MASK, "B,T", "mask"),
        TensorSpec(F.LOSS_MASK, "B,T", "mask"),
        MetaSpec(F.UID),
        MetaSpec(F.GROUP_ID),
    ),
    "reward": (TensorSpec(F.REWARDS, "B", "float"),),
    "advantage": (TensorSpec(F.ADVANTAGES, "B,T", "float"),),
    "update": (TensorSpec(F.OLD_LOGPROBS, "B,T", "float"),),
}

#: Keys that are checked when present, whatever the stage.
OPTIONAL_SPECS: tuple[TensorSpec, ...] = (
    TensorSpec(F.POSITION_IDS, "B,T", "int"),
    TensorSpec(F.ROLLOUT_LOGPROBS, "B,T", "float"),
    TensorSpec(F.OLD_LOGPROBS, "B,T", "float"),
    TensorSpec(F.REF_LOGPROBS, "B,T", "float"),
    TensorSpec(F.VALUES, "B,T", "float"),
    TensorSpec(F.TOKEN_REWARDS, "B,T", "float"),
    TensorSpec(F.RETURNS, "B,T", "float"),
    TensorSpec(F.BASELINE_REWARDS, "B", "float"),
)


def _kind_ok(t: torch.Tensor, kind: str) -> bool:
    if kind == "float":
        return t.is_floating_point()
    if kind == "int":
        return not t.is_floating_point() and t.dtype != torch.bool
    return True  # masks may be bool, int or float 0/1


def _check_tensor(batch: Batch, spec: TensorSpec, stage: str) -> None:
    t = batch.tensors.get(spec.key)
    if t is None:
        have = ", ".join(sorted(batch.keys())) or "nothing"
        hint = " (it is in meta, but must be a tensor)" if spec.key in batch.meta else ""
        raise BatchContractError(
            f"stage {stage!r}: missing key {spec.key!r} {spec.describe()}{hint}; batch has: {have}"
        )
    want = spec.dims.split(",")
    b = len(batch)
    shape_ok = t.dim() == len(want) and t.shape[0] == b
    if shape_ok and len(want) == 2 and F.INPUT_IDS in batch.tensors:
        shape_ok = t.shape[1] == batch.tensors[F.INPUT_IDS].shape[1]
    if not shape_ok or not _kind_ok(t, spec.kind):
        expected = spec.describe().replace("B", str(b), 1)
        if F.INPUT_IDS in batch.tensors:
            expected = expected.replace("T", str(batch.tensors[F.INPUT_IDS].shape[1]), 1)
        raise BatchContractError(
            f"stage {stage!r}: key {spec.key!r} must be {expected}, "
            f"got {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        )


def validate_batch(batch: Batch, stage: str, *, extra: Iterable[str] = ()) -> None:
    """Check ``batch`` against every stage up to and including ``stage``.

    ``extra`` names further tensors the consumer needs (e.g. an estimator's ``values``); they are
    checked with their known spec.
    """
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
    if len(batch) == 0:
        raise BatchContractError(f"stage {stage!r}: batch is empty")
    for s in STAGES[: STAGES.index(stage) + 1]:
        for spec in STAGE_SPECS[s]:
            if spec.key == F.OLD_LOGPROBS and batch.info.get(OLD_LOGPROBS_FROM_UPDATE):
                continue
            if isinstance(spec, MetaSpec):
                if spec.key not in batch.meta:
                    raise BatchContractError(
                        f"stage {stage!r}: missing per-row meta {spec.key!r}; "
                        f"meta has: {', '.join(sorted(batch.meta)) or 'nothing'}"
                    )
            else:
                _check_tensor(batch, spec, stage)
    known = {s.key: s for s in OPTIONAL_SPECS}
    for key in extra:
        _check_tensor(batch, known.get(key, TensorSpec(key, "B,T", "float")), stage)
    for spec in OPTIONAL_SPECS:
        if spec.key in batch.tensors:
            _check_tensor(batch, spec, stage)
