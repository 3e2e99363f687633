"""rollout.async_generation=auto: the decode loop in a process on a GPU, in the thread on the CPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nemo_azr.preflight import load_config
from nemo_azr.trainer.async_rollout import async_generation_mode, device_of


@pytest.mark.parametrize(
    ("setting", "device", "expected"),
    [
        ("auto", "cuda", "process"),
        ("auto", "cpu", "thread"),
        ("auto", "meta", "thread"),
        ("thread", "cuda", "thread"),  # an explicit choice is kept on every device
        ("process", "cpu", "process"),
    ],
)
def test_async_generation_mode(setting, device, expected):
    assert async_generation_mode(setting, torch.device(device)) == expected


def test_device_of_reads_the_generation_model():
    on_meta = SimpleNamespace(model=torch.nn.Linear(2, 2, device="meta"))
    assert device_of(on_meta).type == "meta"
    assert device_of(SimpleNamespace(model=None)).type == "cpu"  # e.g. an engine without a torch model
    assert device_of(SimpleNamespace(model=torch.nn.Sequential())).type == "cpu"  # no parameters


def test_auto_is_the_default_and_accepted():
    cfg = load_config(["rollout.async_rollout=true"])
    assert cfg.rollout.async_generation == "auto"
