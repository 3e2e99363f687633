"""Rollout importance weights (TIS / MIS, token / sequence) against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_azr.algorithms.off_policy import rollout_is_weights
from nemo_azr.errors import ConfigError
from nemo_azr.preflight import load_config

# Row 0: three trained tokens with log-ratios (old - rollout) 0, ln 3, -ln 2; row 1: one token, ln 1.5.
OLD = torch.tensor(
    [[0.0, -1.0, -1.0 + math.log(3), -2.0 - math.log(2)], [0.0, -0.5 + math.log(1.5), 0.0, 0.0]]
)
ROLLOUT = torch.tensor([[9.0, -1.0, -1.0, -2.0], [9.0, -0.5, 0.0, 0.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])


def test_truncated_token_weights():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, mode="tis", cap=2.0)
    expected = torch.tensor([[0.0, 1.0, 2.0, 0.5], [0.0, 1.5, 0.0, 0.0]])  # ratio 3 -> cap 2
    torch.testing.assert_close(w, expected)
    assert m["off_policy/is_weight_mean"] == pytest.approx((1 + 2 + 0.5 + 1.5) / 4)
    assert m["off_policy/is_weight_max"] == pytest.approx(2.0)
    assert m["off_policy/is_ratio_max"] == pytest.approx(3.0)
    assert m["off_policy/clipped_frac"] == pytest.approx(1 / 4)


def test_masked_token_weights():
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, mode="mis", cap=2.0)
    expected = torch.tensor([[0.0, 1.0, 0.0, 0.5], [0.0, 1.5, 0.0, 0.0]])  # ratio 3 > cap: dropped
    torch.testing.assert_close(w, expected)
    assert m["off_policy/masked_frac"] == pytest.approx(1 / 4)


def test_sequence_level_weights():
    # Row 0: exp(0 + ln 3 - ln 2) = 1.5 on each of its tokens; row 1: 1.5.
    w, m = rollout_is_weights(OLD, ROLLOUT, MASK, mode="tis", cap=1.4, level="sequence")
    torch.testing.assert_close(w, MASK * 1.4)
    assert m["off_policy/clipped_frac"] == pytest.approx(1.0)  # both sequences over the cap
    w, _ = rollout_is_weights(OLD, ROLLOUT, MASK, mode="mis", cap=2.0, level="sequence")
    torch.testing.assert_close(w, MASK * 1.5)


def test_on_policy_weights_are_one():
    w, m = rollout_is_weights(OLD, OLD.clone(), MASK, mode="tis", cap=2.0)
    torch.testing.assert_close(w, MASK)
    assert m["off_policy/clipped_frac"] == 0.0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.off_policy_correction=is"], "off_policy_correction='is' is not one of"),
        (["algorithm.is_level=row"], "is_level='row' is not one of"),
        (
            ["algorithm.off_policy_correction=tis", "algorithm.is_cap=0.5"],
            "is_cap must be a finite number >= 1",
        ),
        (["algorithm.off_policy_correction=tis", "algorithm.use_rollout_logprobs=true"], "use one of them"),
        (["rollout.max_policy_lag=-1"], "max_policy_lag must be >= 0"),
        (["rollout.async_generation=fork"], "async_generation='fork' is not one of"),
        (["rollout.async_rollout=true", "rollout.workflow=azr"], "not available for self-play"),
        (["rollout.async_rollout=true", "model.backend=megatron"], "needs model.backend=hf"),
    ],
)
def test_bad_off_policy_configs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides)


@pytest.mark.parametrize(
    ("overrides", "warned"),
    [
        (["rollout.async_rollout=true", "rollout.max_policy_lag=1"], True),
        (
            ["rollout.async_rollout=true", "rollout.max_policy_lag=2", "algorithm.off_policy_correction=tis"],
            False,
        ),
        (
            ["rollout.async_rollout=true", "rollout.max_policy_lag=1", "algorithm.use_rollout_logprobs=true"],
            False,
        ),
        (["rollout.async_rollout=true", "rollout.max_policy_lag=0"], False),  # the synchronous steps
        (["rollout.max_policy_lag=3"], False),  # synchronous: the lag never happens
    ],
)
def test_an_uncorrected_lag_is_warned_about(overrides, warned):
    from nemo_azr.trainer.async_rollout import uncorrected_lag_warning

    warning = uncorrected_lag_warning(load_config(overrides))
    assert (warning is not None) is warned
    if warned:
        assert "max_policy_lag=1" in warning and "off_policy_correction=tis" in warning
