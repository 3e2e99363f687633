"""The generation process on a CUDA GPU: weights shared by CUDA IPC, pushes seen by the child, the
CUDA RNG carried, so its samples are the in-process backend's. Skipped without CUDA (CI);
``scripts/gpu_check.sh`` runs it on a GPU machine (the CPU path: tests/unit/test_process_backend.py)."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from nemo_azr.config.schema import NemoAzrConfig, TinyModelConfig  # noqa: E402
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from nemo_azr.models.hf.policy import HFPolicy  # noqa: E402
from nemo_azr.models.tiny import ensure_tiny_model, load_tokenizer  # noqa: E402
from nemo_azr.rollout.hf_backend import HFGenerationBackend  # noqa: E402
from nemo_azr.rollout.process_backend import ProcessGenerationBackend  # noqa: E402
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402


def test_cuda_samples_and_weight_push_match_in_process(tmp_path):
    path = ensure_tiny_model(TinyModelConfig(cache_dir=str(tmp_path)))
    tok = load_tokenizer(path)
    policy = HFPolicy(path, NemoAzrConfig(), trainable=True, device="cuda")
    local = HFGenerationBackend(policy.model, tok)
    remote = ProcessGenerationBackend(HFGenerationBackend(policy.model, tok))
    try:
        requests = [
            GenerationRequest(encode_prompt(tok, [{"role": "user", "content": q}]), request_id=q)
            for q in ("What is 1 + 2?", "Hi", "What is 7 + 8?")
        ]
        sampling = SamplingParams(n=2, temperature=0.9, max_new_tokens=8)

        def flat(outputs):
            return [s.token_ids for o in outputs for s in o.samples]

        torch.manual_seed(5)
        want = flat(local.generate(requests, sampling))
        torch.manual_seed(5)
        assert flat(remote.generate(requests, sampling)) == want
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        local.sync_weights(policy)
        remote.sync_weights(policy)
        greedy = SamplingParams(n=1, max_new_tokens=8, greedy=True)
        assert flat(remote.generate(requests, greedy)) == flat(local.generate(requests, greedy))
    finally:
        remote.shutdown()
