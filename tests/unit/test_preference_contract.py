"""The preference-data contract: labels, pair ids, and the errors naming what breaks it."""

from __future__ import annotations

import pytest
import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.preference import pair_rows, validate_preference_batch
from nemo_azr.errors import BatchContractError


def _batch(labels, pair_ids=None, loss_rows=None):
    n = len(labels)
    loss = torch.ones(n, 3, dtype=torch.long) if loss_rows is None else torch.tensor(loss_rows)
    meta = {} if pair_ids is None else {F.PAIR_ID: list(pair_ids)}
    return Batch(
        {
            F.INPUT_IDS: torch.zeros(n, 3, dtype=torch.long),
            F.ATTENTION_MASK: torch.ones(n, 3, dtype=torch.long),
            F.LOSS_MASK: loss,
            F.PREFERENCE_LABEL: torch.tensor(labels),
        },
        meta,
    )


def test_pairs_are_found_in_order_of_first_appearance():
    b = _batch([0, 1, 1, 0, 1, 0], ["p", "p", "q", "r", "r", "q"])
    validate_preference_batch(b, paired=True)
    chosen, rejected = pair_rows(b)
    assert chosen.tolist() == [1, 2, 4] and rejected.tolist() == [0, 5, 3]


def test_unpaired_data_needs_labels_only():
    validate_preference_batch(_batch([1, 0, 0]), paired=False)


@pytest.mark.parametrize(
    ("batch", "paired", "message"),
    [
        (_batch([1, 0]), True, "paired losses need per-row meta 'pair_id'"),
        (_batch([1, 1, 0], ["a", "a", "a"]), True, "pair 'a' has 2 chosen and 1 rejected"),
        (_batch([1, 0], ["a", "b"]), True, "pair 'a' has 1 chosen and 0 rejected"),
        (_batch([1, 2]), False, "must hold 0 or 1 only"),
        (_batch([1, 0], loss_rows=[[0, 1, 1], [0, 0, 0]]), False, "has no response token"),
    ],
)
def test_broken_preference_data_names_what_is_wrong(batch, paired, message):
    with pytest.raises(BatchContractError, match=message):
        validate_preference_batch(batch, paired=paired)


def test_a_missing_label_is_named():
    b = _batch([1, 0])
    del b.tensors[F.PREFERENCE_LABEL]
    with pytest.raises(BatchContractError, match="missing key 'preference_label'"):
        validate_preference_batch(b, paired=False)
