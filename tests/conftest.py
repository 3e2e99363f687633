import os

import pytest
import torch

# Tests must never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
torch.set_num_threads(min(2, torch.get_num_threads()))


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
