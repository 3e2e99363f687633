"""generation.backend=megatron with decode=static on CUDA: the step replayed from a CUDA graph gives
megatron-core's own inference loop's greedy tokens, sampled log-probs the trainer's teacher-forced
forward reproduces, the same samples under the same seed, and sees the weights an optimizer step
changed in place. Skipped without CUDA (CI); scripts/gpu_check.sh runs it (the CPU path:
megatron_static in tests/unit/test_generation_contract.py)."""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():  # before importing megatron-core: CI skips this file at once
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("megatron.core")

from nemo_azr.config.schema import NemoAzrConfig, TinyModelConfig  # noqa: E402
from nemo_azr.contracts import Batch  # noqa: E402
from nemo_azr.contracts import fields as F  # noqa: E402
from nemo_azr.contracts.assemble import pack_prompt_response  # noqa: E402
from nemo_azr.contracts.generation import GenerationRequest, SamplingParams  # noqa: E402
from nemo_azr.contracts.update import UpdateContext  # noqa: E402
from nemo_azr.models.tiny import ensure_tiny_model, load_tokenizer  # noqa: E402
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402


def _flat(outputs):
    return [s for o in outputs for s in o.samples]


def _batch(requests, outputs, pad_id: int) -> Batch:
    samples = _flat(outputs)
    rows = [r.prompt_ids for r, o in zip(requests, outputs) for _ in o.samples]
    return Batch(
        pack_prompt_response(
            rows, [s.token_ids for s in samples], [s.logprobs for s in samples], pad_id=pad_id
        )
    )


def test_megatron_graph_replay_matches_megatrons_own_loop(tmp_path):
    from nemo_azr.distributed.parallel import destroy_parallel
    from nemo_azr.models.megatron.policy import MegatronPolicy
    from nemo_azr.rollout.megatron_backend import MegatronGenerationBackend

    path = ensure_tiny_model(TinyModelConfig(cache_dir=str(tmp_path)))
    tok = load_tokenizer(path)
    cfg = NemoAzrConfig()
    cfg.model.backend = "megatron"
    cfg.parallel.use_te = "false"
    cfg.optim.lr = 0.05
    cfg.generation.temperature = 0.8  # the trainer's log-probs are of the tempered policy
    policy = MegatronPolicy(path, cfg, trainable=True, device="cuda")
    try:
        policy.setup_optimizer(total_steps=2)
        dynamic = MegatronGenerationBackend(policy, tok, decode="dynamic")
        static = MegatronGenerationBackend(policy, tok)  # auto: static with CUDA graphs on CUDA
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
            torch.testing.assert_close(
                torch.tensor(g.logprobs), torch.tensor(w.logprobs), rtol=1e-4, atol=1e-4
            )

        sampled = SamplingParams(n=4, temperature=0.8, top_p=0.95, max_new_tokens=24)
        torch.manual_seed(11)
        first = static.generate(requests, sampled)
        torch.manual_seed(11)
        again = static.generate(requests, sampled)
        assert [s.token_ids for s in _flat(again)] == [s.token_ids for s in _flat(first)]
        assert len({tuple(s.token_ids) for s in _flat(first)}) > 3  # fresh randomness per replay
        batch = _batch(requests, first, tok.pad_token_id)
        old = policy.compute_logprobs(batch)  # the trainer's teacher-forced log-probs
        torch.testing.assert_close(batch[F.ROLLOUT_LOGPROBS], old.cpu().float(), rtol=0, atol=1e-4)

        # an optimizer step changes the weights in place: the replayed graph decodes the new ones
        batch[F.OLD_LOGPROBS] = old
        batch[F.ADVANTAGES] = torch.randn(batch[F.LOSS_MASK].shape) * batch[F.LOSS_MASK]
        captured = static._static.graphs_captured  # the greedy and the sampled shapes
        policy.update(batch, UpdateContext(norm_length=batch.seq_len))
        static.sync_weights(policy)
        dynamic.sync_weights(policy)
        want = _flat(dynamic.generate(requests, greedy))
        got = _flat(static.generate(requests, greedy))
        assert [s.token_ids for s in got] == [s.token_ids for s in want]
        assert static._static.graphs_captured == captured  # replayed, not recorded again
    finally:
        destroy_parallel()
