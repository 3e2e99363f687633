"""The hf generation backend in its own process gives the samples the in-process backend gives,
follows weight pushes, and turns a failing or dead child into one clear error."""

import os
import signal

import pytest
import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.rollout.process_backend import GenerationProcessError, ProcessGenerationBackend
from nemo_azr.rollout.single_turn import encode_prompt

SAMPLING = SamplingParams(n=2, temperature=0.9, max_new_tokens=8)


@pytest.fixture(scope="module")
def setup(tiny_model_path):
    torch.set_num_threads(1)  # the child runs one thread too: same kernels, same numbers
    tok = load_tokenizer(tiny_model_path)
    policy = HFPolicy(tiny_model_path, NemoAzrConfig(), trainable=True)
    local = HFGenerationBackend(policy.model, tok)
    remote = ProcessGenerationBackend(HFGenerationBackend(policy.model, tok), num_threads=1)
    requests = [
        GenerationRequest(encode_prompt(tok, [{"role": "user", "content": q}]), request_id=q)
        for q in ("What is 1 + 2?", "Hi", "What is 7 + 8?")
    ]
    yield policy, local, remote, requests
    remote.shutdown()


def _flat(outputs):
    return [(o.request.request_id, s.token_ids, s.text, s.finish_reason) for o in outputs for s in o.samples]


def _logprobs(outputs):
    return torch.tensor([lp for o in outputs for s in o.samples for lp in s.logprobs])


def test_same_samples_and_rng_stream_as_in_process(setup):
    _, local, remote, requests = setup
    torch.manual_seed(7)
    expected = [local.generate(requests, SAMPLING), local.generate(requests, SAMPLING)]
    after_local = torch.rand(3)
    torch.manual_seed(7)
    got = [remote.generate(requests, SAMPLING), remote.generate(requests, SAMPLING)]
    after_remote = torch.rand(3)
    for want, have in zip(expected, got):
        assert _flat(have) == _flat(want)
        torch.testing.assert_close(_logprobs(have), _logprobs(want), rtol=0, atol=1e-6)
    # the parent's RNG advanced exactly as if it had sampled itself
    assert torch.equal(after_remote, after_local)
    assert _flat(got[0]) != _flat(got[1])  # and the two calls did draw different numbers


def test_weight_push_reaches_the_child(setup):
    policy, local, remote, requests = setup
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    version = remote.version
    remote.sync_weights(policy)
    local.sync_weights(policy)
    assert remote.version == version + 1
    greedy = SamplingParams(n=1, max_new_tokens=8, greedy=True)
    have, want = remote.generate(requests, greedy), local.generate(requests, greedy)
    assert _flat(have) == _flat(want)
    assert all(o.policy_version == remote.version for o in have)


def test_child_error_and_death_are_reported(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    policy = HFPolicy(tiny_model_path, NemoAzrConfig(), trainable=False)
    remote = ProcessGenerationBackend(HFGenerationBackend(policy.model, tok), num_threads=1)
    try:
        bad = [GenerationRequest([10**9])]  # a token id outside the vocabulary
        with pytest.raises(GenerationProcessError, match="generation process failed"):
            remote.generate(bad, SamplingParams(max_new_tokens=2))
        ok = [GenerationRequest(encode_prompt(tok, [{"role": "user", "content": "Hi"}]))]
        assert remote.generate(ok, SamplingParams(max_new_tokens=2))  # the child survives an error
        os.kill(remote._child.pid, signal.SIGKILL)
        with pytest.raises(GenerationProcessError, match="exit code -9"):
            remote.generate(ok, SamplingParams(max_new_tokens=2))
    finally:
        remote.shutdown()


def test_too_small_shared_memory_is_a_clear_error(tiny_model_path, monkeypatch):
    import nemo_azr.rollout.process_backend as pb

    policy = HFPolicy(tiny_model_path, NemoAzrConfig(), trainable=False)
    needed = sum(t.numel() * t.element_size() for t in policy.model.state_dict().values())
    monkeypatch.setattr(pb.shutil, "disk_usage", lambda _: shutil_usage(free=needed - 1))
    with pytest.raises(GenerationProcessError, match="enlarge it"):
        pb._check_shared_memory(policy.model)
    monkeypatch.setattr(pb.shutil, "disk_usage", lambda _: shutil_usage(free=needed))
    pb._check_shared_memory(policy.model)  # exactly enough passes


def shutil_usage(free: int):
    import shutil

    return shutil._ntuple_diskusage(total=free, used=0, free=free)
