"""fused_linear_policy_loss (torch and Triton backends) against policy_objective on naive log-probs.

The reference materialises the logits in float64, takes log_softmax/gather/entropy and calls the
core's policy_objective; the fused path must give the same loss, the same metrics and the same
gradients for hidden states and LM-head weight.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from nemo_azr.algorithms.objective import policy_objective
from nemo_azr.algorithms.off_policy import rollout_is_weights
from nemo_azr.config.schema import AlgorithmConfig
from nemo_azr.errors import BatchContractError
from nemo_azr.kernels import fused_linear_policy_loss
from nemo_azr.kernels.policy_loss import aggregation_weights

HAS_TRITON = importlib.util.find_spec("triton") is not None
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="no triton"))]
REL = 1e-5


@pytest.fixture(autouse=True)
def _interpret(monkeypatch, request):
    """Triton on CPU runs in the interpreter (see tests/conftest.py), for this test only."""
    if DEVICE == "cpu" and "triton" in request.node.name:
        import triton.language as tl

        if type(tl.max).__name__ != "InterpretedFunction":
            pytest.skip("triton was imported before TRITON_INTERPRET=1 (see tests/conftest.py)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def rel_err(got, want) -> float:
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def _problem(b=3, t=9, h=16, v=32000, temperature=0.8, seed=0):
    """Hidden states, LM head, targets and the [B, T] tensors of one micro-batch (float64)."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, t, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) * 0.4
    targets = torch.randint(0, v, (b, t), generator=g)
    mask = (torch.rand(b, t, generator=g) < 0.8).float()
    mask[:, :2] = 0  # a prompt
    mask[-1] = 0  # a row without trained tokens still counts as a sequence
    with torch.no_grad():
        logp = torch.log_softmax(hidden @ weight.t() / temperature, -1).gather(-1, targets[..., None])[..., 0]
    # off-policy enough that both clip branches and the dual clip are active
    old = logp + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)
    mask[0, 2] = 1
    old[0, 2] = logp[0, 2] - 1.0  # ratio e > clip_ratio_c with a negative advantage: dual clip
    ref = logp + 0.3 * torch.randn(b, t, generator=g, dtype=torch.float64)
    sign = torch.tensor([-1.0, 1.0] * b, dtype=torch.float64)[:b, None]  # both signs of advantage
    adv = sign * (0.5 + torch.rand(b, 1, generator=g, dtype=torch.float64)) + 0.1 * torch.randn(
        b, t, generator=g, dtype=torch.float64
    )
    return {
        "hidden": hidden,
        "weight": weight,
        "targets": targets,
        "loss_mask": mask,
        "old_logprobs": (old * mask).float(),
        "ref_logprobs": (ref * mask).float(),
        "advantages": (adv * mask).float(),
        "temperature": temperature,
    }


def _cfg(agg="token-mean", **kw):
    cfg = AlgorithmConfig(loss_agg_mode=agg, entropy_coef=0.01, loss_eta=0.5 if agg == "token-mean" else 0.0)
    cfg.kl.coef = 0.05
    cfg.kl.estimator = kw.pop("kl_estimator", "k3")
    for k, val in kw.items():
        setattr(cfg, k, val)
    return cfg


def _reference(p, cfg, norms, on_policy=False, dtype=torch.float64, rollout=None, kl_weight=None):
    """policy_objective on naive log-probs; returns loss, metrics and the grads of hidden / weight.
    ``rollout``: the advantages are first weighted by ``rollout_is_weights(pi_old, rollout)``."""
    h = p["hidden"].to(dtype).clone().requires_grad_(True)
    w = p["weight"].to(dtype).clone().requires_grad_(True)
    logp_all = torch.log_softmax((h @ w.t()) / p["temperature"], -1)
    mask = p["loss_mask"]
    lp = logp_all.gather(-1, p["targets"][..., None])[..., 0] * mask
    ent = -(logp_all.exp() * logp_all).sum(-1) * mask
    old = lp.detach() if on_policy else p["old_logprobs"].to(dtype)
    advantages, is_metrics = p["advantages"].to(dtype), {}
    if rollout is not None:
        c = cfg
        weights, is_metrics = rollout_is_weights(
            old, rollout, mask, mode=c.off_policy_correction, cap=c.is_cap, level=c.is_level
        )
        advantages = advantages * weights.to(dtype)
    loss, metrics = policy_objective(
        logprobs=lp,
        old_logprobs=old,
        advantages=advantages,
        loss_mask=mask.to(dtype),
        cfg=cfg,
        ref_logprobs=p["ref_logprobs"].to(dtype),
        entropy=ent if cfg.entropy_coef > 0 else None,
        kl_weight=kl_weight,
        **norms,
    )
    loss.backward()
    return loss.detach(), {**metrics, **is_metrics}, h.grad, w.grad


def _fused(
    p,
    cfg,
    norms,
    backend,
    on_policy=False,
    dtype=torch.float32,
    chunk_size=1024,
    rows=None,
    rollout=None,
    kl_weight=None,
):
    rows = slice(None) if rows is None else rows
    h = p["hidden"].to(device=DEVICE, dtype=dtype).clone().requires_grad_(True)
    w = p["weight"].to(device=DEVICE, dtype=dtype).clone().requires_grad_(True)
    loss, metrics = fused_linear_policy_loss(
        h[rows],
        w,
        p["targets"][rows].to(DEVICE),
        advantages=p["advantages"][rows].to(DEVICE),
        loss_mask=p["loss_mask"][rows].to(DEVICE),
        cfg=cfg,
        old_logprobs=None if on_policy else p["old_logprobs"][rows].to(DEVICE),
        ref_logprobs=p["ref_logprobs"][rows].to(DEVICE),
        rollout_logprobs=None if rollout is None else rollout[rows].to(DEVICE),
        temperature=p["temperature"],
        backend=backend,
        chunk_size=chunk_size,
        kl_weight=None if kl_weight is None else kl_weight[rows].to(DEVICE),
        **norms,
    )
    loss.backward()
    return loss.detach(), metrics, h.grad, w.grad


def _assert_same(fused, ref, rel=REL):
    loss, metrics, gh, gw = fused
    rloss, rmetrics, rgh, rgw = ref
    assert abs(float(loss.detach()) - float(rloss.detach())) <= rel * max(1.0, abs(float(rloss.detach())))
    assert metrics.keys() == rmetrics.keys()
    for k in metrics:
        assert abs(metrics[k] - rmetrics[k]) <= rel * max(1.0, abs(rmetrics[k])), (k, metrics[k], rmetrics[k])
    assert rel_err(gh, rgh) < rel
    assert rel_err(gw, rgw) < rel


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("agg", AGG_MODES)
def test_fused_ppo_dual_clip_kl_entropy_matches_policy_objective(agg, backend):
    p = _problem(seed=AGG_MODES.index(agg))
    cfg = _cfg(agg, dual_clip=True, clip_ratio_c=1.5)
    norms = {"num_tokens": float(p["loss_mask"].sum()) + 3, "num_seqs": 4, "norm_length": 8}
    ref = _reference(p, cfg, norms)
    assert 0 < ref[1]["actor/clip_frac"] < 1 and ref[1]["actor/dual_clip_frac"] > 0  # branches exercised
    _assert_same(_fused(p, cfg, norms, backend), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_kl_row_weights_match_policy_objective(backend):
    """``kl_weight[B]`` scales each row's KL term: the loss is linear in it (row weights [0, 2, 1]
    give the weightless loss plus twice row 0's KL term's share plus row 1's), weights of 1 are no
    weights, and the fused pass gives the same loss, metrics and gradients."""
    p = _problem(seed=5)
    cfg = _cfg("token-mean", dual_clip=True, clip_ratio_c=1.5)
    norms = {"num_tokens": float(p["loss_mask"].sum()), "num_seqs": 3, "norm_length": 8}
    weights = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)

    def loss(w):
        return float(_reference(p, cfg, norms, kl_weight=torch.tensor(w, dtype=torch.float64))[0])

    zero = loss([0.0, 0.0, 0.0])
    assert loss([2.0, 1.0, 0.0]) - zero == pytest.approx(
        2 * (loss([1.0, 0.0, 0.0]) - zero) + (loss([0.0, 1.0, 0.0]) - zero), rel=1e-9, abs=1e-12
    )
    assert loss([1.0, 0.0, 0.0]) - zero > 0  # row 0's KL term is not empty
    assert loss([1.0, 1.0, 1.0]) == pytest.approx(float(_reference(p, cfg, norms)[0]), rel=1e-12)
    ref = _reference(p, cfg, norms, kl_weight=weights)
    _assert_same(_fused(p, cfg, norms, backend, kl_weight=weights.float()), ref)
    with pytest.raises(BatchContractError, match="kl_weight"):
        _fused(p, cfg, norms, backend, kl_weight=torch.ones(2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_plain_clip_k1_no_entropy_on_policy(backend):
    p = _problem(seed=7, temperature=1.0)
    cfg = _cfg("seq-mean-token-mean", dual_clip=False, entropy_coef=0.0, kl_estimator="k1")
    norms = {"num_tokens": None, "num_seqs": None, "norm_length": None}
    ref = _reference(p, cfg, norms)
    out = _fused(p, cfg, norms, backend)
    assert "actor/entropy" not in out[1]
    _assert_same(out, ref)
    # on-policy (old_logprobs=None): ratio 1, no clipping
    ref = _reference(p, cfg, norms, on_policy=True)
    out = _fused(p, cfg, norms, backend, on_policy=True)
    assert out[1]["actor/clip_frac"] == 0.0 and out[1]["actor/ratio_mean"] == 1.0
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on_policy", [True, False])
@pytest.mark.parametrize("mode", ["tis", "mis"])
def test_fused_importance_weights_match_weighted_advantages(mode, on_policy, backend):
    """Without old log-probs the weights come from the pass's own log-probs, chunk by chunk; with
    them they are applied before the pass. Both equal the reference with the advantages weighted."""
    p = _problem(seed=13)
    cfg = _cfg("seq-mean-token-mean", off_policy_correction=mode, is_cap=1.3)
    norms = {"num_tokens": None, "num_seqs": None, "norm_length": None}
    g = torch.Generator().manual_seed(2)
    mask = p["loss_mask"]
    with torch.no_grad():
        logp = torch.log_softmax(p["hidden"] @ p["weight"].t() / p["temperature"], -1)
        lp = logp.gather(-1, p["targets"][..., None])[..., 0]
    rollout = ((lp + 0.4 * torch.randn(lp.shape, generator=g, dtype=lp.dtype)) * mask).float()
    ref = _reference(p, cfg, norms, on_policy=on_policy, rollout=rollout.double())
    over = "off_policy/clipped_frac" if mode == "tis" else "off_policy/masked_frac"
    assert 0 < ref[1][over] < 1  # some weights capped, some not
    _assert_same(_fused(p, cfg, norms, backend, on_policy=on_policy, chunk_size=5, rollout=rollout), ref)


def test_fused_sequence_weights_without_old_logprobs_are_refused():
    p = _problem(seed=1)
    cfg = _cfg(off_policy_correction="tis", is_level="sequence")
    with pytest.raises(BatchContractError, match="sequence-level importance weights"):
        _fused(p, cfg, {}, "torch", on_policy=True, rollout=p["old_logprobs"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_cispo_single_pass_matches_policy_objective(backend):
    p = _problem(seed=5)
    cfg = _cfg("token-mean", loss="cispo", clip_ratio_low=1.0, clip_ratio_high=0.05)
    norms = {"num_tokens": None, "num_seqs": None, "norm_length": None}
    ref = _reference(p, cfg, norms)
    assert 0 < ref[1]["actor/clip_frac"] < 1  # some weights clipped, some not
    _assert_same(_fused(p, cfg, norms, backend), ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_gspo_takes_the_two_pass_path(backend):
    p = _problem(seed=3)
    cfg = _cfg("seq-mean-token-mean", loss="gspo")
    norms = {"num_tokens": None, "num_seqs": 3, "norm_length": None}
    _assert_same(_fused(p, cfg, norms, backend), _reference(p, cfg, norms))


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_chunks_and_micro_batches_sum_exactly(backend):
    """Small token chunks, and two micro-batches with the mini-batch's normalisers, give the whole-batch result."""
    p = _problem(b=4, seed=11)
    cfg = _cfg("seq-mean-token-mean")
    norms = {"num_tokens": float(p["loss_mask"].sum()), "num_seqs": 4, "norm_length": 8}
    whole = _fused(p, cfg, norms, backend)
    chunked = _fused(p, cfg, norms, backend, chunk_size=5)
    assert abs(float(whole[0]) - float(chunked[0])) < 1e-6
    assert rel_err(chunked[2], whole[2]) < 1e-4 and rel_err(chunked[3], whole[3]) < 1e-4
    a = _fused(p, cfg, norms, backend, rows=slice(0, 1))
    b = _fused(p, cfg, norms, backend, rows=slice(1, 4))
    assert abs(float(a[0]) + float(b[0]) - float(whole[0])) < 1e-6
    assert rel_err(a[3] + b[3], whole[3]) < REL


@pytest.mark.parametrize("backend", BACKENDS)
def test_fused_bf16_close_to_float64_reference(backend):
    p = _problem(seed=5)
    cfg = _cfg("token-mean")
    norms = {"num_tokens": None, "num_seqs": None, "norm_length": None}
    loss, metrics, gh, gw = _fused(p, cfg, norms, backend, dtype=torch.bfloat16)
    assert gh.dtype == gw.dtype == torch.bfloat16
    rloss, rmetrics, rgh, rgw = _reference(p, cfg, norms)
    assert abs(float(loss) - float(rloss)) < 3e-2 * max(1.0, abs(float(rloss)))
    assert rel_err(gh, rgh) < 5e-2 and rel_err(gw, rgw) < 5e-2


def test_aggregation_weights_reproduce_aggregate_loss():
    from nemo_azr.algorithms.aggregation import aggregate_loss

    p = _problem(seed=2)
    x = torch.randn(p["loss_mask"].shape)
    for agg in AGG_MODES:
        cfg = _cfg(agg)
        kw = {"num_tokens": 17.0, "num_seqs": 5, "norm_length": 6}
        w = aggregation_weights(p["loss_mask"], cfg, **kw)
        want = aggregate_loss(x, p["loss_mask"], agg, eta=cfg.loss_eta, **kw)
        assert torch.allclose((w * x).sum(), want, rtol=1e-6, atol=1e-7)


def test_fused_entropy_switch_and_missing_ref():
    from nemo_azr.errors import BatchContractError

    p = _problem(seed=4)
    cfg = _cfg("token-mean")  # entropy_coef > 0, kl.coef > 0
    norms = {"num_tokens": None, "num_seqs": None, "norm_length": None}
    # compute_entropy=False drops the entropy term (as policy_objective without entropy does)
    h = p["hidden"].float().requires_grad_(True)
    args = (h, p["weight"].float(), p["targets"])
    kw = {
        "advantages": p["advantages"],
        "loss_mask": p["loss_mask"],
        "cfg": cfg,
        "old_logprobs": p["old_logprobs"],
        "temperature": p["temperature"],
        "backend": "torch",
        **norms,
    }
    loss, metrics = fused_linear_policy_loss(
        *args, ref_logprobs=p["ref_logprobs"], compute_entropy=False, **kw
    )
    assert "actor/entropy" not in metrics
    cfg0 = _cfg("token-mean", entropy_coef=0.0)
    ref = _reference(p, cfg0, norms)
    assert abs(float(loss.detach()) - float(ref[0])) < 1e-5
    with pytest.raises(BatchContractError, match="ref_logprobs"):
        fused_linear_policy_loss(*args, **kw)
    with pytest.raises(BatchContractError, match="advantages"):
        fused_linear_policy_loss(*args, **{**kw, "advantages": p["advantages"][:, :3]})
