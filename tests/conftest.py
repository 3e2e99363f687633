import importlib.util
import os

import pytest
import torch

# Tests must never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(min(2, torch.get_num_threads()))

# Triton's CPU interpreter has to be chosen before triton is first imported (it decorates its own
# tl.* helpers then). Without a GPU, import triton here, before any test module, in interpreter mode;
# the kernel tests set TRITON_INTERPRET=1 per test, so backend="auto" elsewhere stays on torch.
if not torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    _interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    import triton  # noqa: F401

    if _interpret is None:
        del os.environ["TRITON_INTERPRET"]


@pytest.fixture(scope="session")
def tiny_cache(tmp_path_factory):
    """A cache folder shared by the whole session, so the tiny model is built once."""
    path = os.environ.get("NEMO_AZR_TEST_CACHE") or str(tmp_path_factory.mktemp("nemo_azr_cache"))
    return path


@pytest.fixture(scope="session")
def tiny_model_path(tiny_cache):
    from nemo_azr.config.schema import TinyModelConfig
    from nemo_azr.models.tiny import ensure_tiny_model

    return ensure_tiny_model(TinyModelConfig(cache_dir=tiny_cache))
