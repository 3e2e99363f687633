"""Loss aggregation modes against hand-computed values, and micro-batch additivity."""

from __future__ import annotations

import pytest
import torch

from nemo_azr.algorithms.aggregation import AGG_MODES, aggregate_loss
from nemo_azr.errors import ConfigError

# rows: [1, 2, 3] with mask [1, 1, 0] -> masked sum 3, 2 tokens
#       [4, 5, 6] with mask [1, 0, 0] -> masked sum 4, 1 token
#       [7, 8, 9] with mask [0, 0, 0] -> masked sum 0, 0 tokens
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_token_mean():
    # (1 + 2 + 4) / 3 tokens = 7/3
    assert aggregate_loss(LOSS, MASK, "token-mean").item() == pytest.approx(7 / 3)


def test_token_mean_with_eta():
    # RLCR normaliser: 7 / (3 + 1)
    assert aggregate_loss(LOSS, MASK, "token-mean", eta=1.0).item() == pytest.approx(7 / 4)


def test_seq_mean_token_sum():
    # (3 + 4 + 0) / 3 sequences
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum").item() == pytest.approx(7 / 3)
    # and with only the first two rows: (3 + 4) / 2 = 3.5
    assert aggregate_loss(LOSS[:2], MASK[:2], "seq-mean-token-sum").item() == pytest.approx(3.5)


def test_seq_mean_token_mean():
    # (3/2 + 4/1 + 0/max(0, 1)) / 3 = 5.5 / 3; the empty row still counts as a sequence
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean").item() == pytest.approx(5.5 / 3)


def test_seq_mean_token_sum_norm():
    # Dr.GRPO: 7 / (3 sequences * norm_length 4) = 7/12
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx(
        7 / 12
    )


def test_global_normalisers_override_local_counts():
    # token-mean with num_tokens=10: 7/10; seq modes with num_seqs=7: 7/7 = 1 and 5.5/7
    assert aggregate_loss(LOSS, MASK, "token-mean", num_tokens=10).item() == pytest.approx(0.7)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", num_seqs=7).item() == pytest.approx(1.0)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", num_seqs=7).item() == pytest.approx(5.5 / 7)


def test_sum_norm_requires_norm_length():
    with pytest.raises(ConfigError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")
    with pytest.raises(ConfigError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=0)


def test_unknown_mode_lists_modes():
    with pytest.raises(ConfigError) as info:
        aggregate_loss(LOSS, MASK, "token-sum")
    for mode in AGG_MODES:
        assert mode in str(info.value)


def test_zero_tokens_gives_zero_loss_with_grad():
    loss = LOSS.clone().requires_grad_(True)
    out = aggregate_loss(loss, torch.zeros(3, 3), "token-mean")
    assert out.item() == 0.0
    assert out.requires_grad
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(3, 3, dtype=torch.float64))


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_sum_equals_mini_batch(mode):
    gen = torch.Generator().manual_seed(0)
    loss = torch.randn(7, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(7, 5, generator=gen) > 0.4).to(torch.float32)
    mask[3] = 0  # one row with no trained tokens
    kwargs = {"norm_length": 6, "eta": 0.5}

    whole_leaf = loss.clone().requires_grad_(True)
    whole = aggregate_loss(whole_leaf, mask, mode, **kwargs)
    whole.backward()

    micro_leaf = loss.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for rows in (slice(0, 2), slice(2, 3), slice(3, 7)):  # uneven micro-batches
        total = total + aggregate_loss(
            micro_leaf[rows], mask[rows], mode, num_tokens=float(mask.sum()), num_seqs=7, **kwargs
        )
    total.backward()
    torch.testing.assert_close(total, whole)
    torch.testing.assert_close(micro_leaf.grad, whole_leaf.grad)


def test_local_normalisers_are_not_additive():
    # Guards the test above: without the global counts the micro-batch sum differs.
    # micro-batches [0:1] and [1:3] with token-mean: 3/2 + 4/1 = 5.5 != 7/3
    parts = aggregate_loss(LOSS[:1], MASK[:1], "token-mean") + aggregate_loss(
        LOSS[1:], MASK[1:], "token-mean"
    )
    assert parts.item() == pytest.approx(5.5)
    assert parts.item() != pytest.approx(aggregate_loss(LOSS, MASK, "token-mean").item())
