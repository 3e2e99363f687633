"""When the megatron backend's static decode path is taken (rollout/megatron_static_decode.py).

Its tokens and log-probs are checked by the generation contract suite (``megatron_static``); here:
a model the path cannot serve is refused by name with ``decode=static`` and falls back to
megatron-core's loop with ``decode=auto``; on a CPU ``auto`` keeps megatron-core's loop.
"""

from __future__ import annotations

import pytest

pytest.importorskip("megatron.core")

from nemo_azr.config.schema import NemoAzrConfig  # noqa: E402
from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.models.tiny import load_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def policy(tiny_model_path):
    from nemo_azr.distributed.parallel import destroy_parallel
    from nemo_azr.models.megatron.policy import MegatronPolicy

    cfg = NemoAzrConfig()
    cfg.model.backend = "megatron"
    cfg.parallel.use_te = "false"
    pol = MegatronPolicy(tiny_model_path, cfg, trainable=False)
    yield pol
    destroy_parallel()


def test_static_decode_is_refused_by_name_and_auto_falls_back(policy, tiny_model_path, monkeypatch):
    from nemo_azr.models.megatron.logprobs import unwrap_gpt_model
    from nemo_azr.rollout.megatron_backend import MegatronGenerationBackend

    tok = load_tokenizer(tiny_model_path)
    assert MegatronGenerationBackend(policy, tok, decode="static").decode == "static"
    assert MegatronGenerationBackend(policy, tok).decode == "auto"  # static on CUDA only
    monkeypatch.setattr(unwrap_gpt_model(policy.chunks[0]).config, "apply_rope_fusion", True)
    with pytest.raises(
        ConfigError, match="decode=static cannot decode this model: TransformerEngine's fused RoPE"
    ):
        MegatronGenerationBackend(policy, tok, decode="static")
    assert MegatronGenerationBackend(policy, tok).decode == "dynamic"
    with pytest.raises(ConfigError, match="generation.decode='fast'"):
        MegatronGenerationBackend(policy, tok, decode="fast")
