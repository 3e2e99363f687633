"""Shared-prefix forward (model.shared_prefix): the plain forward's hidden states, log-probs and
gradients (fp32), with each shared prefix computed once."""

from __future__ import annotations

import functools

import pytest
import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.update import UpdateContext
from nemo_azr.errors import ConfigError
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.training import shared_prefix as sp
from nemo_azr.preflight import load_config


def _batch(seed: int = 0, vocab: int = 60) -> Batch:
    """The RLCR two-turn layout: two contexts of different lengths (left-padded), four sampled
    continuations of each (right-padded), trained only on the continuation, plus one row whose
    whole prompt is distinct."""
    g = torch.Generator().manual_seed(seed)
    contexts = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (11, 7, 9)]
    prompts = [contexts[0]] * 4 + [contexts[1]] * 4 + [contexts[2]]
    r_lens = [3, 5, 1, 4, 2, 6, 3, 3, 5]
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in r_lens]
    t = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = t[F.LOSS_MASK]
    t[F.ADVANTAGES] = torch.randn(mask.shape, generator=g) * mask
    t[F.OLD_LOGPROBS] = (-torch.rand(mask.shape, generator=g) - 2.0) * mask
    return Batch(t, {F.UID: [f"r{i}" for i in range(len(prompts))]})


def _policy(tiny_cache, tiny_model_path, *overrides) -> HFPolicy:
    cfg = load_config([f"model.tiny.cache_dir={tiny_cache}", "algorithm.kl.coef=0", *overrides])
    torch.manual_seed(0)
    return HFPolicy(tiny_model_path, cfg)


def _count_decoder_calls(policy: HFPolicy, monkeypatch) -> list[tuple[int, int]]:
    """The ``input_ids`` shape of every call of ``policy``'s decoder, recorded as they happen."""
    calls = []
    decoder = getattr(policy.model, policy.model.base_model_prefix)
    original = decoder.forward

    @functools.wraps(original)  # keeps the signature the cache keyword is read from
    def counting(*args, **kwargs):
        calls.append(tuple(kwargs["input_ids"].shape))
        return original(*args, **kwargs)

    monkeypatch.setattr(decoder, "forward", counting)
    return calls


def test_prefix_width_is_the_first_trained_column():
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])
    assert sp.shared_prefix_width(mask, 5) == 3  # row 2 trains nothing: it does not constrain
    assert sp.shared_prefix_width(torch.zeros(2, 5), 5) == 5
    assert sp.shared_prefix_width(None, 5) == 5


def test_hidden_states_equal_the_plain_forward_and_prefixes_run_once(
    tiny_cache, tiny_model_path, monkeypatch
):
    batch = _batch()
    plain = _policy(tiny_cache, tiny_model_path)
    shared = _policy(tiny_cache, tiny_model_path, "model.shared_prefix=true")
    calls = _count_decoder_calls(shared, monkeypatch)
    real = batch[F.ATTENTION_MASK].bool()
    h_plain, _ = plain._hidden_states(batch)
    h_shared, _ = shared._hidden_states(batch)
    torch.testing.assert_close(h_shared[real], h_plain[real], atol=2e-5, rtol=1e-5)
    width = batch.seq_len
    prefix = int((batch[F.LOSS_MASK] > 0).int().argmax(dim=1).min())  # the 7-token context's end
    assert calls == [(3, prefix), (9, width - prefix)]  # 3 distinct prefixes, then every row's rest


def test_no_shared_prefix_falls_back_to_the_plain_forward(tiny_cache, tiny_model_path):
    batch = _batch().index([0, 4, 8])  # one row per context: nothing to share
    decoder = _policy(tiny_cache, tiny_model_path).model.model
    ids, attn = batch[F.INPUT_IDS], batch[F.ATTENTION_MASK]
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    assert sp.shared_prefix_decoder_forward(decoder, ids, attn, pos, 5) is None


@pytest.mark.parametrize("fused", [True, False])
def test_gradients_and_logprobs_equal_the_plain_forward(tiny_cache, tiny_model_path, fused):
    batch = _batch(seed=1)
    common = [f"model.fused_policy_loss={str(fused).lower()}", "algorithm.entropy_coef=0.01"]
    plain = _policy(tiny_cache, tiny_model_path, *common)
    shared = _policy(tiny_cache, tiny_model_path, *common, "model.shared_prefix=true")
    torch.testing.assert_close(
        shared.compute_logprobs(batch), plain.compute_logprobs(batch), atol=2e-5, rtol=1e-5
    )
    n_tok = float(batch[F.LOSS_MASK].sum())
    m_plain = plain.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    m_shared = shared.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy"):
        assert m_shared[key] == pytest.approx(m_plain[key], rel=1e-4, abs=1e-6)
    for (name, p_plain), p in zip(plain.model.named_parameters(), shared.model.parameters()):
        torch.testing.assert_close(p.grad, p_plain.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["model.shared_prefix=true", "model.sequence_packing=true"], "choose one"),
        (["model.shared_prefix=true", "model.gradient_checkpointing=true"], "gradient_checkpointing=false"),
        (["model.shared_prefix=true", "model.backend=megatron"], "for model.backend=hf"),
    ],
)
def test_bad_shared_prefix_configs(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides)


def test_shuffled_mini_batches_keep_the_rows_of_a_prefix_together(tiny_cache, tiny_model_path, monkeypatch):
    """With one shuffled mini-batch the rows are put back in batch order, so each context's rows
    share a micro-batch: 3 prefix forwards (2 + 1 distinct contexts), not one per row."""
    batch = _batch()
    policy = _policy(
        tiny_cache, tiny_model_path, "model.shared_prefix=true", "algorithm.micro_batch_size=8",
        "algorithm.shuffle_mini_batches=true", "algorithm.mini_batch_size=0",
    )  # fmt: skip
    policy.setup_optimizer(total_steps=1)
    seen = []
    original = sp.shared_prefix_decoder_forward

    def spy(decoder, ids, attn, pos, width):
        out = original(decoder, ids, attn, pos, width)
        key = torch.cat([ids[:, :width], attn[:, :width]], dim=1)
        seen.append((len(ids), len(torch.unique(key, dim=0)), out is not None))
        return out

    monkeypatch.setattr("nemo_azr.models.hf.policy.shared_prefix_decoder_forward", spy)
    policy.update(batch, UpdateContext(norm_length=16, generator=torch.Generator().manual_seed(3)))
    assert seen == [(8, 2, True), (1, 1, False)]


def _common_start_batch(seed: int = 2, vocab: int = 60) -> Batch:
    """The self-play layout: every prompt opens with the same 40 tokens (a system prompt and a
    demonstration) and goes on with its own question, so no two rows share their leading columns
    (left padding puts the opening at a different column in each) but all share the opening."""
    g = torch.Generator().manual_seed(seed)
    opening = torch.randint(5, vocab, (40,), generator=g).tolist()
    prompts = [opening + torch.randint(5, vocab, (n,), generator=g).tolist() for n in (4, 9, 1, 6)]
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in (3, 5, 2, 4)]
    t = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = t[F.LOSS_MASK]
    t[F.ADVANTAGES] = torch.randn(mask.shape, generator=g) * mask
    t[F.OLD_LOGPROBS] = (-torch.rand(mask.shape, generator=g) - 2.0) * mask
    return Batch(t, {F.UID: [f"r{i}" for i in range(len(prompts))]})


def test_common_start_finds_the_opening_every_row_shares():
    ids = torch.tensor([[0, 0, 7, 8, 9, 4, 0], [7, 8, 9, 5, 6, 0, 0], [0, 7, 8, 3, 1, 2, 0]])
    attn = (ids > 0).long()
    starts, c = sp.common_start(ids, attn, min_tokens=1)
    assert starts.tolist() == [2, 0, 1] and c == 2  # 7 8; the third row goes on with 3
    assert sp.common_start(ids, attn) is None  # 2 tokens: below MIN_COMMON_START, not worth a call
    assert sp.common_start(ids, attn, min_tokens=3) is None and sp.common_start(ids, attn, min_tokens=2)
    short = torch.tensor([[7, 8, 0], [7, 8, 9]])  # a row no longer than the opening keeps a token
    assert sp.common_start(short, (short > 0).long(), min_tokens=1)[1] == 1
    gap = torch.tensor([[7, 0, 8], [7, 8, 9]])  # real tokens not one run: a layout it does not know
    assert sp.common_start(gap, (gap > 0).long(), min_tokens=1) is None
    differ = torch.tensor([[7, 8, 9], [6, 8, 9]])
    assert sp.common_start(differ, (differ > 0).long(), min_tokens=1) is None


def test_a_common_opening_runs_once_with_the_plain_forwards_results(tiny_cache, tiny_model_path, monkeypatch):
    batch = _common_start_batch()
    plain = _policy(tiny_cache, tiny_model_path)
    shared = _policy(tiny_cache, tiny_model_path, "model.shared_prefix=true")
    calls = _count_decoder_calls(shared, monkeypatch)
    real = batch[F.ATTENTION_MASK].bool()
    h_plain, _ = plain._hidden_states(batch)
    h_shared, _ = shared._hidden_states(batch)
    torch.testing.assert_close(h_shared[real], h_plain[real], atol=2e-5, rtol=1e-5)
    assert calls == [(1, 40), (4, batch.seq_len - 40)]  # the opening once, then every row's own columns
    torch.testing.assert_close(
        shared.compute_logprobs(batch), plain.compute_logprobs(batch), atol=2e-5, rtol=1e-5
    )
    n_tok = float(batch[F.LOSS_MASK].sum())
    m_plain = plain.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    m_shared = shared.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    assert m_shared["actor/loss"] == pytest.approx(m_plain["actor/loss"], rel=1e-4, abs=1e-6)
    for (name, p_plain), p in zip(plain.model.named_parameters(), shared.model.parameters()):
        torch.testing.assert_close(p.grad, p_plain.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_the_layout_that_runs_fewer_columns_is_chosen(tiny_cache, tiny_model_path, monkeypatch):
    """Rows grouped by a whole shared prompt (two prompts, three rows each) run it once per prompt
    rather than only the opening the two prompts share."""
    g = torch.Generator().manual_seed(4)
    opening = torch.randint(5, 60, (33,), generator=g).tolist()
    contexts = [opening + torch.randint(5, 60, (n,), generator=g).tolist() for n in (12, 10)]
    prompts = [contexts[0]] * 3 + [contexts[1]] * 3
    responses = [torch.randint(5, 60, (2,), generator=g).tolist() for _ in prompts]
    batch = Batch(pack_prompt_response(prompts, responses, None, pad_id=0))
    shared = _policy(tiny_cache, tiny_model_path, "model.shared_prefix=true")
    calls = _count_decoder_calls(shared, monkeypatch)
    shared._hidden_states(batch)
    assert calls == [(2, 45), (6, 2)]  # 2 prompts of 45 columns, not the 33-token opening
