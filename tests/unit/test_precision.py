"""``auto`` low precision: bf16 only where the device has native bf16 matmuls, and a warning when
bf16 is asked for by name where it has not (there a bf16 matmul runs a reference kernel)."""

import types

import pytest
import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.rollout.hf_backend import backend_kwargs
from nemo_azr.utils import precision
from nemo_azr.utils.precision import resolve_low_precision


@pytest.fixture
def cpu_bf16(monkeypatch):
    """Set whether this test's CPU counts as having native bf16."""

    def set_native(native: bool) -> None:
        monkeypatch.setattr(precision, "native_bf16", lambda device_type: native and device_type == "cpu")
        precision._warn_once.cache_clear()

    return set_native


@pytest.mark.parametrize("native,expected", [(True, torch.bfloat16), (False, None)])
def test_auto_is_bf16_only_where_it_is_native(cpu_bf16, native, expected):
    cpu_bf16(native)
    assert resolve_low_precision("auto", "cpu", "model.autocast_dtype") is expected
    cfg = NemoAzrConfig().generation
    cfg.dtype = "auto"
    assert backend_kwargs(cfg, "cpu").get("dtype") is expected


def test_empty_is_off_and_a_name_is_that_dtype(cpu_bf16):
    cpu_bf16(True)
    assert resolve_low_precision("", "cpu", "k") is None
    assert resolve_low_precision("float16", "cpu", "k") is torch.float16
    assert resolve_low_precision("bfloat16", "cpu", "k") is torch.bfloat16
    assert "dtype" not in backend_kwargs(NemoAzrConfig().generation, "cpu")  # "" -> model.dtype


def test_bf16_by_name_without_native_kernels_warns_once_and_is_kept(cpu_bf16, capsys):
    cpu_bf16(False)
    for _ in range(2):
        assert resolve_low_precision("bfloat16", "cpu", "generation.dtype") is torch.bfloat16
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "generation.dtype=bfloat16" in err[0] and "auto" in err[0]
    cpu_bf16(True)
    resolve_low_precision("bfloat16", "cpu", "generation.dtype")
    assert capsys.readouterr().err == ""


def test_native_bf16_reads_onednn_on_the_cpu(monkeypatch):
    """The CPU answer is oneDNN's test of the instructions; a torch without that op counts as no."""
    precision.native_bf16.cache_clear()
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True, raising=False)
    assert precision.native_bf16("cpu") is True
    precision.native_bf16.cache_clear()
    # a torch without the op: an op namespace without it (deleting the attribute is not enough:
    # torch.ops resolves it again on the next access, and this CPU's real answer may be True)
    monkeypatch.setattr(torch.ops, "mkldnn", types.SimpleNamespace())
    assert precision.native_bf16("cpu") is False
    precision.native_bf16.cache_clear()
    assert precision.native_bf16("meta") is False
