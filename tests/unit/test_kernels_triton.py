"""Triton kernels (nemo_azr.kernels, backend="triton") against float64 and torch references.

Without a GPU the kernels run in Triton's CPU interpreter: tests/conftest.py imports triton in
interpreter mode before any test module, and every test here sets TRITON_INTERPRET=1 for itself
only (so backend="auto" in other tests stays on torch). With a GPU they run on CUDA tensors.
Sizes are small in N (the interpreter is slow) and real in V (32000, 151936).
"""

from __future__ import annotations

import pytest
import torch

from nemo_azr.errors import ConfigError
from nemo_azr.kernels import linear_token_logprobs, resolve_backend, token_logprobs

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
IGNORE = -100
REL32 = 1e-5


@pytest.fixture(autouse=True)
def _interpret(monkeypatch):
    if DEVICE == "cpu":
        import triton.language as tl

        if type(tl.max).__name__ != "InterpretedFunction":
            pytest.skip("triton was imported before TRITON_INTERPRET=1 (see tests/conftest.py)")
        monkeypatch.setenv("TRITON_INTERPRET", "1")


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (a relative error that tiny entries cannot blow up)."""
    got, want = got.detach().double(), want.detach().double()
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


def bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of bfloat16 numbers at ``|x|`` (8 significant bits), as float64."""
    _, exp = torch.frexp(x.double().abs())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float64), exp - 8).clamp(min=2.0**-126)


def assert_within_one_bf16_step(got: torch.Tensor, want: torch.Tensor, floor: float = 0.0) -> None:
    """``got`` (bf16) differs from ``want`` by at most one bf16 step at ``want``.

    ``floor`` (relative to ``max |want|``) allows for float32 accumulation noise on entries that are
    sums of cancelling terms (a weight-gradient entry of ~1e-13 out of terms of ~1e-5).
    """
    assert got.dtype == torch.bfloat16
    err = (got.double() - want.double()).abs()
    ulp = bf16_ulp(want) + floor * float(want.abs().max())
    worst = float((err / ulp).max())
    assert worst <= 1.0, f"{worst:.3f} bf16 steps"


def _rows(n, v, seed, scale=3.0, n_ignored=1):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, v, generator=g, dtype=torch.float64) * scale
    targets = torch.randint(0, v, (n,), generator=g)
    targets[torch.randperm(n, generator=g)[:n_ignored]] = IGNORE
    coef = torch.randn(n, generator=g, dtype=torch.float64)
    coef_e = torch.randn(n, generator=g, dtype=torch.float64)
    return logits, targets, coef, coef_e


def _reference(logits64, targets, temperature):
    """float64 log-probs and entropy (0 on ignored rows) with autograd to ``logits64``."""
    logp = torch.log_softmax(logits64 / temperature, -1)
    ignored = targets == IGNORE
    lp = logp.gather(1, targets.clamp(min=0)[:, None])[:, 0].masked_fill(ignored, 0.0)
    ent = -(logp.exp() * logp).sum(-1).masked_fill(ignored, 0.0)
    return lp, ent


def _leaf(x, dtype):
    return x.detach().to(device=DEVICE, dtype=dtype).clone().requires_grad_(True)


# ---------------------------------------------------------------------------------------------
# logits given: token_logprobs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vocab", [32000, 151936])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_fp32_matches_float64(vocab, temperature):
    logits, targets, coef, coef_e = _rows(6, vocab, seed=vocab)
    x = _leaf(logits, torch.float32)
    lp, ent = token_logprobs(x, targets.to(DEVICE), temperature, backend="triton", return_entropy=True)
    x64 = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference(x64, targets, temperature)
    assert lp.dtype == torch.float32 and lp.shape == (6,)
    assert rel_err(lp.cpu(), ref_lp) < REL32 and rel_err(ent.cpu(), ref_ent) < REL32

    (lp * coef.float().to(DEVICE) + ent * coef_e.float().to(DEVICE)).sum().backward()
    (ref_lp * coef + ref_ent * coef_e).sum().backward()
    assert rel_err(x.grad.cpu(), x64.grad) < REL32
    ignored = targets == IGNORE
    assert torch.all(lp.cpu()[ignored] == 0) and torch.all(x.grad.cpu()[ignored] == 0)
    assert torch.equal(x.detach().cpu(), logits.float())  # input never modified


@pytest.mark.parametrize("vocab", [32000, 151936])
def test_token_logprobs_bf16_within_one_bf16_step(vocab):
    logits, targets, coef, coef_e = _rows(4, vocab, seed=1 + vocab)
    xb = _leaf(logits, torch.bfloat16)
    lp, ent = token_logprobs(xb, targets.to(DEVICE), 0.8, backend="triton", return_entropy=True)
    # exact reference on the same (bf16-rounded) logits
    x64 = xb.detach().cpu().double().requires_grad_(True)
    ref_lp, ref_ent = _reference(x64, targets, 0.8)
    assert lp.dtype == torch.float32
    assert rel_err(lp.cpu(), ref_lp) < REL32 and rel_err(ent.cpu(), ref_ent) < REL32
    (lp * coef.float().to(DEVICE) + ent * coef_e.float().to(DEVICE)).sum().backward()
    (ref_lp * coef + ref_ent * coef_e).sum().backward()
    assert xb.grad.dtype == torch.bfloat16
    assert_within_one_bf16_step(xb.grad.cpu(), x64.grad)


@pytest.mark.parametrize("tile", [512, 4096])
def test_stats_kernel_over_many_tiles_matches_float64(monkeypatch, tile):
    """Rows of many column tiles (the last one ragged), a run of -inf logits and targets in every part
    of the row: the streamed statistics and the target logit (read once, after the row) are exact."""
    from nemo_azr.kernels import triton_logprobs as tk

    monkeypatch.setattr(tk, "INTERPRET_BLOCK_V", tile)
    monkeypatch.setattr(tk, "GPU_BLOCK_V", tile)
    logits, targets, _, _ = _rows(5, 5000, seed=tile)
    logits[1, 3000:] = float("-inf")  # whole tiles of -inf after finite ones
    targets[1], targets[2], targets[3] = 17, 4999, 2560  # first tile, last (ragged) tile, a tile start
    targets[4] = IGNORE
    x = logits.float().to(DEVICE)
    lp, ent = token_logprobs(x, targets.to(DEVICE), 0.7, backend="triton", return_entropy=True)
    ref_lp, _ = _reference(logits.clone(), targets, 0.7)
    logp = torch.log_softmax(logits / 0.7, -1)
    ref_ent = -(logp.exp() * logp.masked_fill(logp == float("-inf"), 0.0)).sum(-1)
    ref_ent = ref_ent.masked_fill(targets == IGNORE, 0.0)
    assert rel_err(lp.cpu(), ref_lp) < REL32 and rel_err(ent.cpu(), ref_ent) < REL32


# ---------------------------------------------------------------------------------------------
# fused LM head: linear_token_logprobs
# ---------------------------------------------------------------------------------------------


def _linear_data(n, h, v, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64) * 0.4
    targets = torch.randint(0, v, (n,), generator=g)
    targets[1] = IGNORE
    coef = torch.randn(n, generator=g, dtype=torch.float64)
    coef_e = torch.randn(n, generator=g, dtype=torch.float64)
    return hidden, weight, targets, coef, coef_e


@pytest.mark.parametrize("vocab", [32000, 151936])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_linear_fp32_matches_float64(vocab, temperature):
    # Chunks of 8 tokens: CPU BLAS multiplies matrices of fewer than 8 rows with a gemv-like kernel
    # whose long sequential sums over V lose ~2e-5 (torch's GEMM, the same for every backend;
    # test_linear_chunk_boundaries covers small chunks against the torch backend).
    hidden, weight, targets, coef, coef_e = _linear_data(16, 32, vocab, seed=vocab + 7)
    h, w = _leaf(hidden, torch.float32), _leaf(weight, torch.float32)
    lp, ent = linear_token_logprobs(
        h, w, targets.to(DEVICE), temperature, backend="triton", chunk_size=8, return_entropy=True
    )
    h64, w64 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference(h64 @ w64.t(), targets, temperature)
    assert rel_err(lp.cpu(), ref_lp) < REL32 and rel_err(ent.cpu(), ref_ent) < REL32

    (lp * coef.float().to(DEVICE) + ent * coef_e.float().to(DEVICE)).sum().backward()
    (ref_lp * coef + ref_ent * coef_e).sum().backward()
    assert rel_err(h.grad.cpu(), h64.grad) < REL32
    assert rel_err(w.grad.cpu(), w64.grad) < REL32
    assert torch.all(h.grad.cpu()[targets == IGNORE] == 0)


def test_linear_chunk_boundaries_match_torch_backend():
    hidden, weight, targets, coef, coef_e = _linear_data(7, 16, 32000, seed=21)
    outs = []
    for backend in ("triton", "torch"):
        h, w = _leaf(hidden, torch.float32), _leaf(weight, torch.float32)
        lp, ent = linear_token_logprobs(
            h, w, targets.to(DEVICE), 1.2, backend=backend, chunk_size=3, return_entropy=True
        )
        (lp * coef.float().to(DEVICE) + ent * coef_e.float().to(DEVICE)).sum().backward()
        outs.append((lp.detach().cpu(), ent.detach().cpu(), h.grad.cpu(), w.grad.cpu()))
    for a, b in zip(*outs):
        assert rel_err(a, b) < REL32


def test_linear_bf16_matches_torch_backend_within_one_bf16_step():
    hidden, weight, targets, coef, coef_e = _linear_data(6, 32, 151936, seed=3)
    outs = {}
    for backend in ("triton", "torch"):
        h, w = _leaf(hidden, torch.bfloat16), _leaf(weight, torch.bfloat16)
        lp, ent = linear_token_logprobs(
            h, w, targets.to(DEVICE), 0.9, backend=backend, chunk_size=4, return_entropy=True
        )
        (lp * coef.float().to(DEVICE) + ent * coef_e.float().to(DEVICE)).sum().backward()
        outs[backend] = (lp.cpu(), ent.cpu(), h.grad.cpu(), w.grad.cpu())
    (lp_t, ent_t, gh_t, gw_t), (lp_r, ent_r, gh_r, gw_r) = outs["triton"], outs["torch"]
    # same bf16 GEMM logits, float32 math after it: the values agree to float32 precision
    assert rel_err(lp_t, lp_r) < REL32 and rel_err(ent_t, ent_r) < REL32
    assert gh_t.dtype == gw_t.dtype == torch.bfloat16
    # the bf16 gradients may differ only where the float32 results round to neighbouring bf16 values
    # (plus float32 noise on weight-gradient entries that are sums of cancelling token terms)
    assert_within_one_bf16_step(gh_t, gh_r)
    assert_within_one_bf16_step(gw_t, gw_r, floor=1e-6)
    # and both are bf16 approximations of the exact float64 answer
    h64, w64 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    ref_lp, _ = _reference(h64 @ w64.t(), targets, 0.9)
    assert rel_err(lp_t, ref_lp) < 2e-2


def test_ignore_index_and_all_ignored_rows():
    hidden, weight, targets, coef, _ = _linear_data(5, 16, 32000, seed=11)
    targets[:] = torch.tensor([7, 3, 7, 9, 7])
    h, w = _leaf(hidden, torch.float32), _leaf(weight, torch.float32)
    lp = linear_token_logprobs(h, w, targets.to(DEVICE), backend="triton", ignore_index=7)
    (lp * coef.float().to(DEVICE)).sum().backward()
    ignored = targets == 7
    assert torch.all(lp.cpu()[ignored] == 0) and torch.all(lp.cpu()[~ignored] < 0)
    assert torch.all(h.grad.cpu()[ignored] == 0) and torch.all(h.grad.cpu()[~ignored].abs().sum(-1) > 0)

    x = _leaf(torch.randn(3, 32000, dtype=torch.float64), torch.float32)
    lp, ent = token_logprobs(
        x, torch.full((3,), IGNORE, device=DEVICE), backend="triton", return_entropy=True
    )
    (lp.sum() + ent.sum()).backward()
    assert torch.all(lp == 0) and torch.all(ent == 0) and torch.all(x.grad == 0)


def test_gradcheck_float64_kernels():
    """The kernels' float64 mode (ACC = tl.float64) passes torch.autograd.gradcheck."""
    hidden, weight, targets, _, _ = _linear_data(3, 3, 11, seed=5)
    h, w = _leaf(hidden, torch.float64), _leaf(weight, torch.float64)
    t = targets.to(DEVICE)
    assert torch.autograd.gradcheck(
        lambda a, b: linear_token_logprobs(a, b, t, 0.8, backend="triton", chunk_size=2, return_entropy=True),
        (h, w),
        fast_mode=True,
    )
    x = _leaf(hidden @ weight.t(), torch.float64)
    assert torch.autograd.gradcheck(
        lambda a: token_logprobs(a, t, 1.3, backend="triton", return_entropy=True), (x,), fast_mode=True
    )


def test_auto_backend_follows_triton_interpret(monkeypatch):
    x = torch.zeros(2, 3)
    if DEVICE == "cpu":
        assert resolve_backend("auto", x) == "triton"  # TRITON_INTERPRET=1 set by the fixture
        monkeypatch.delenv("TRITON_INTERPRET")
        assert resolve_backend("auto", x) == "torch"
        with pytest.raises(ConfigError, match="TRITON_INTERPRET"):
            resolve_backend("triton", x)
    else:
        assert resolve_backend("auto", x.cuda()) == "triton"
    assert resolve_backend("torch", x) == "torch"
    # the same results through auto and triton
    logits, targets, _, _ = _rows(3, 1000, seed=2)
    if DEVICE == "cpu":
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    x = logits.float().to(DEVICE)
    a = token_logprobs(x, targets.to(DEVICE), backend="auto")
    b = token_logprobs(x, targets.to(DEVICE), backend="torch")
    assert rel_err(a.cpu(), b.cpu()) < REL32
