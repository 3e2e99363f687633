import math

import pytest

from nemo_azr.models.training.optim import lr_factor


def test_linear_warmup_then_constant():
    f = [
        lr_factor(s, warmup_steps=4, total_steps=10, schedule="constant", min_lr_ratio=0.0) for s in range(6)
    ]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decay_to_floor():
    # after 2 warm-up steps, 8 decay steps from 1.0 to min_lr_ratio=0.2
    kw = dict(warmup_steps=2, total_steps=10, schedule="linear", min_lr_ratio=0.2)
    assert lr_factor(2, **kw) == pytest.approx(1.0)
    assert lr_factor(6, **kw) == pytest.approx(0.2 + 0.8 * 0.5)
    assert lr_factor(10, **kw) == pytest.approx(0.2)
    assert lr_factor(50, **kw) == pytest.approx(0.2)


def test_cosine_midpoint():
    kw = dict(warmup_steps=0, total_steps=10, schedule="cosine", min_lr_ratio=0.0)
    assert lr_factor(0, **kw) == pytest.approx(1.0)
    assert lr_factor(5, **kw) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_factor(10, **kw) == pytest.approx(0.0, abs=1e-12)
