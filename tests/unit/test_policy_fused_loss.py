"""The hf policy's fused policy-loss path equals its reference path (log-probs, then policy_objective)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.single_turn import encode_prompt

HAS_TRITON = importlib.util.find_spec("triton") is not None


def _batch(tok, n_prompts=3, n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [
        encode_prompt(tok, [{"role": "user", "content": q}]) for q in ("What is 1 + 2?", "Hi", "7 + 8?")
    ][:n_prompts]
    rows_p = [p for p in prompts for _ in range(n)]
    resp = [
        torch.randint(5, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
        for _ in rows_p
    ]
    b = Batch(
        pack_prompt_response(rows_p, resp, None, pad_id=tok.pad_token_id),
        {"uid": list(range(len(rows_p))), "group_id": [i // n for i in range(len(rows_p))]},
    )
    b["advantages"] = torch.randn(len(rows_p), 1, generator=g) * b["loss_mask"]
    return b, g


def _update(path, cfg, tok, device="cpu"):
    pol = HFPolicy(path, cfg, trainable=True, device=device)
    pol.setup_optimizer(total_steps=1)
    batch, g = _batch(tok)
    lp = pol.compute_logprobs(batch).cpu()
    mask = batch["loss_mask"]
    batch["old_logprobs"] = (lp + 0.3 * torch.randn(lp.shape, generator=g)) * mask  # clip branches
    batch["ref_logprobs"] = (lp + 0.2 * torch.randn(lp.shape, generator=g)) * mask
    captured = []
    pol._clip_and_step = lambda: captured.append([p.grad.clone() for p in pol.model.parameters()]) or 1.0
    metrics = pol.update(batch, UpdateContext(norm_length=8))
    return metrics, captured[0]


@pytest.mark.parametrize(
    "backend", ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton"))]
)
def test_fused_update_equals_policy_objective_update(tiny_model_path, backend, monkeypatch):
    if backend == "triton" and not torch.cuda.is_available():
        import triton.language as tl

        if type(tl.max).__name__ != "InterpretedFunction":
            pytest.skip("triton was imported before TRITON_INTERPRET=1 (see tests/conftest.py)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    tok = load_tokenizer(tiny_model_path)
    # On a GPU the triton case runs the compiled kernels (they refuse CPU tensors there)
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    results = []
    for fused in (True, False):
        cfg = NemoAzrConfig()
        cfg.model.kernel_backend = backend
        cfg.model.fused_policy_loss = fused
        cfg.model.logprob_chunk_size = 8
        cfg.generation.temperature = 0.9
        cfg.algorithm.micro_batch_size = 5
        cfg.algorithm.shuffle_mini_batches = False
        cfg.algorithm.loss_agg_mode = "seq-mean-token-mean"
        cfg.algorithm.entropy_coef = 0.01
        cfg.algorithm.kl.coef = 0.05
        cfg.algorithm.clip_ratio_c = 1.5
        results.append(_update(tiny_model_path, cfg, tok, device))
    (m_fused, g_fused), (m_ref, g_ref) = results
    assert m_fused.keys() == m_ref.keys()
    assert "actor/entropy" in m_fused and "actor/kl_loss" in m_fused
    assert 0 < m_ref["actor/clip_frac"] < 1
    for k in m_ref:
        if k != "actor/grad_norm":  # clip_and_step is stubbed out
            assert abs(m_fused[k] - m_ref[k]) <= 1e-5 * max(1.0, abs(m_ref[k])), k
    for a, b in zip(g_fused, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_kernel_backend_is_validated():
    from nemo_azr.errors import ConfigError
    from nemo_azr.preflight import validate_config

    cfg = NemoAzrConfig()
    cfg.model.kernel_backend = "cuda"
    with pytest.raises(ConfigError, match="model.kernel_backend"):
        validate_config(cfg)


@pytest.mark.parametrize("packed", [False, True])
def test_rows_sampled_at_their_own_temperature_get_log_probs_at_it(tiny_model_path, packed):
    """Self-play's proposer_temperature: a row with ``sampling_temperature`` t_r gets
    log_softmax(logits / t_r), checked against the plain forward, padded and packed."""
    tok = load_tokenizer(tiny_model_path)
    cfg = NemoAzrConfig()
    cfg.generation.temperature = 0.9
    cfg.model.sequence_packing = packed
    pol = HFPolicy(tiny_model_path, cfg, trainable=False, device="cpu")
    batch, _ = _batch(tok, n_prompts=2, n=2)
    temps = torch.tensor([0.9, 0.4, 1.3, 0.9])
    batch["sampling_temperature"] = temps
    got = pol.compute_logprobs(batch)
    with torch.no_grad():
        logits = pol.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits.float()
    ref = torch.log_softmax(logits[:, :-1] / temps[:, None, None], -1).gather(
        -1, batch["input_ids"][:, 1:, None]
    )[..., 0]
    mask = batch["loss_mask"][:, 1:].bool()
    assert torch.allclose(got[:, 1:][mask], ref[mask], atol=2e-4)
    # without the key every row is at generation.temperature (so rows 1 and 2 differ from the above)
    del batch.tensors["sampling_temperature"]
    plain = pol.compute_logprobs(batch)
    assert torch.allclose(
        plain[0][batch["loss_mask"][0].bool()], got[0][batch["loss_mask"][0].bool()], atol=2e-4
    )
    assert not torch.allclose(
        plain[1][batch["loss_mask"][1].bool()], got[1][batch["loss_mask"][1].bool()], atol=1e-3
    )
