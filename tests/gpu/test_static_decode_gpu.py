"""generation.decode=static on CUDA: the step replayed from a CUDA graph gives the dynamic loop's greedy
tokens, sampled log-probs that a teacher-forced forward reproduces, the same samples under the same
seed, and sees weights refitted in place. Skipped without CUDA (CI); scripts/gpu_check.sh runs it
(the CPU path: tests/unit/test_static_decode.py)."""

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
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402


def _flat(outputs):
    return [s for o in outputs for s in o.samples]


@pytest.mark.parametrize("grouped", [False, True], ids=["model_attention", "grouped_attention"])
def test_graph_replay_matches_the_dynamic_loop(tmp_path, grouped):
    path = ensure_tiny_model(TinyModelConfig(cache_dir=str(tmp_path)))
    tok = load_tokenizer(path)
    policy = HFPolicy(path, NemoAzrConfig(), trainable=True, device="cuda")
    dynamic = HFGenerationBackend(policy.model, tok, decode="dynamic")
    # auto: static with CUDA graphs on CUDA
    static = HFGenerationBackend(policy.model, tok, grouped_attention=grouped)
    requests = [
        GenerationRequest(encode_prompt(tok, [{"role": "user", "content": q}]))
        for q in ("What is 1 + 2?", "Hi", "What is 7 + 8?")
    ]
    greedy = SamplingParams(n=3, greedy=True, max_new_tokens=24)
    want = _flat(dynamic.generate(requests, greedy))
    got = _flat(static.generate(requests, greedy))
    assert static._static is not None and static._static.graphs_captured == 1
    assert [s.token_ids for s in got] == [s.token_ids for s in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=1e-4, atol=1e-4)

    sampled = SamplingParams(n=4, temperature=0.8, top_p=0.95, max_new_tokens=24)
    torch.manual_seed(11)
    first = _flat(static.generate(requests, sampled))
    torch.manual_seed(11)
    again = _flat(static.generate(requests, sampled))
    assert [s.token_ids for s in again] == [s.token_ids for s in first]
    assert len({tuple(s.token_ids) for s in first}) > 3  # the replays drew fresh randomness per step
    with torch.no_grad():
        for i, s in enumerate(first):
            prompt = requests[i // 4].prompt_ids
            ids = torch.tensor([prompt + s.token_ids], device="cuda")
            logits = static.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / 0.8
            ref = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None])[:, 0]
            torch.testing.assert_close(torch.tensor(s.logprobs, device="cuda"), ref, rtol=1e-4, atol=1e-4)

    with torch.no_grad():  # a refit writes in place: the recorded graph must see the new weights
        for p in policy.model.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    dynamic.sync_weights(policy)
    static.sync_weights(policy)
    assert [s.token_ids for s in _flat(static.generate(requests, greedy))] == [
        s.token_ids for s in _flat(dynamic.generate(requests, greedy))
    ]
