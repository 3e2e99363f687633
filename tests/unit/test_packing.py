"""Sequence packing and token-budget micro-batches give the padded, fixed-row results (fp32)."""

from __future__ import annotations

import pytest
import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.training.microbatch import micro_batches, token_budget_groups, trim_padding
from nemo_azr.models.training.packing import pack_layout
from nemo_azr.preflight import load_config


def test_first_fit_decreasing_packed_and_padded_costs():
    # Hand-worked: rows sorted by length 8 (row 2), 5 (0), 3 (1), 2 (3); budget 10.
    # Packed (sum of lengths): 8 | 5 -> new | 3 joins 5 (8) | 2 joins 8 (10).
    assert token_budget_groups([5, 3, 8, 2], 10, packed=True) == [[2, 3], [0, 1]]
    # Padded (rows x longest): 8 | 5 -> new (2x8 > 10) | 3 joins 5 (2x5 = 10) | 2: 2x8, 3x5 > 10 -> new.
    assert token_budget_groups([5, 3, 8, 2], 10, packed=False) == [[2], [0, 1], [3]]
    # A row over the budget goes alone.
    assert token_budget_groups([12, 1], 10, packed=True) == [[0], [1]]


def test_pack_layout_bins_as_long_as_the_longest_row():
    # Capacity 8: row 2 (8) fills bin 0; rows 0 (5) and 1 (3) share bin 1; row 3 (2) fits neither.
    assert pack_layout([5, 3, 8, 2]) == (3, 8, [8, 13, 0, 16])


def _batch(seed: int = 0, vocab: int = 60) -> Batch:
    """Left-padded prompts and right-padded responses of very different lengths (the rollout layout)."""
    g = torch.Generator().manual_seed(seed)
    p_lens, r_lens = [3, 7, 2, 5, 4, 6], [9, 1, 4, 12, 2, 6]
    prompts = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in p_lens]
    responses = [torch.randint(5, vocab, (n,), generator=g).tolist() for n in r_lens]
    t = pack_prompt_response(prompts, responses, None, pad_id=0)
    mask = t[F.LOSS_MASK]
    t[F.ADVANTAGES] = torch.randn(mask.shape, generator=g) * mask
    t[F.OLD_LOGPROBS] = (-torch.rand(mask.shape, generator=g) - 2.0) * mask
    return Batch(t, {F.UID: [f"r{i}" for i in range(6)], F.GROUP_ID: [0, 0, 0, 1, 1, 1]})


def test_trim_padding_drops_columns_no_row_uses():
    b = _batch().index([2, 4])  # prompts 2 and 4 long, responses 4 and 2 long: pad on both sides
    trimmed, start = trim_padding(b)
    assert start == 7 - 4 and trimmed.seq_len == 4 + 4
    assert torch.equal(trimmed[F.INPUT_IDS], b[F.INPUT_IDS][:, start : start + 8])
    assert int(trimmed[F.ATTENTION_MASK].sum()) == int(b[F.ATTENTION_MASK].sum())


def _policy(tiny_cache, tiny_model_path, *overrides) -> HFPolicy:
    cfg = load_config([f"model.tiny.cache_dir={tiny_cache}", "algorithm.kl.coef=0", *overrides])
    torch.manual_seed(0)
    return HFPolicy(tiny_model_path, cfg)


def test_packed_hidden_states_equal_padded(tiny_cache, tiny_model_path):
    batch = _batch()
    padded = _policy(tiny_cache, tiny_model_path)
    packed = _policy(tiny_cache, tiny_model_path, "model.sequence_packing=true")
    real = batch[F.ATTENTION_MASK].bool()
    h_pad, _ = padded._hidden_states(batch)
    h_pack, _ = packed._hidden_states(batch)
    torch.testing.assert_close(h_pack[real], h_pad[real], atol=2e-5, rtol=1e-5)
    assert h_pack[~real].abs().max() == 0
    # A row's hidden states do not depend on its neighbours: row 1 alone gives the same values.
    alone, _ = packed._hidden_states(batch.index([1]))
    torch.testing.assert_close(alone[0][real[1]], h_pack[1][real[1]], atol=2e-5, rtol=1e-5)


SCHEDULES = {
    "padded_rows": [],
    "padded_budget": ["algorithm.max_tokens_per_microbatch=40"],
    "packed_rows": ["model.sequence_packing=true", "algorithm.micro_batch_size=4"],
    "packed_budget": ["model.sequence_packing=true", "algorithm.max_tokens_per_microbatch=30"],
}


@pytest.mark.parametrize(
    ("schedule", "fused", "agg"),
    [
        *[
            (s, f, "token-mean")
            for s in ("padded_budget", "packed_rows", "packed_budget")
            for f in (True, False)
        ],
        ("packed_budget", True, "seq-mean-token-mean"),
        ("packed_budget", True, "seq-mean-token-sum-norm"),
    ],
)
def test_update_gradients_equal_one_padded_batch(tiny_cache, tiny_model_path, schedule, fused, agg):
    batch = _batch()
    common = [f"model.fused_policy_loss={str(fused).lower()}", "algorithm.entropy_coef=0.01"]
    common.append(f"algorithm.loss_agg_mode={agg}")
    ref = _policy(tiny_cache, tiny_model_path, *common, "algorithm.micro_batch_size=64")
    other = _policy(tiny_cache, tiny_model_path, *common, *SCHEDULES[schedule])
    pieces = other.micro_batches(batch)
    assert len(pieces) > 1 and len({len(m.batch) for m in pieces}) > 1  # uneven micro-batches
    n_tok = float(batch[F.LOSS_MASK].sum())
    m_ref = ref.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    m_other = other.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    for key in ("actor/loss", "actor/pg_loss", "actor/entropy"):
        assert m_other[key] == pytest.approx(m_ref[key], rel=1e-4, abs=1e-6)
    for (name, p_ref), p in zip(ref.model.named_parameters(), other.model.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("schedule", ["padded_budget", "packed_budget"])
def test_no_grad_logprobs_come_back_in_row_order(tiny_cache, tiny_model_path, schedule):
    batch = _batch(seed=1)
    ref = _policy(tiny_cache, tiny_model_path).compute_logprobs(batch)
    other = _policy(tiny_cache, tiny_model_path, *SCHEDULES[schedule]).compute_logprobs(batch)
    assert other.shape == ref.shape
    torch.testing.assert_close(other, ref, atol=2e-5, rtol=1e-5)


def test_budget_off_is_the_fixed_row_schedule():
    batch = _batch()
    pieces = micro_batches(batch, rows=4)
    assert [m.rows.tolist() for m in pieces] == [[0, 1, 2, 3], [4, 5]]
    assert all(m.batch.seq_len == batch.seq_len and m.start == 0 for m in pieces)


def test_packing_rejects_positions_that_do_not_count_from_zero(tiny_cache, tiny_model_path):
    batch = _batch()
    batch[F.POSITION_IDS] = batch[F.POSITION_IDS] + batch[F.ATTENTION_MASK]  # starts at 1
    policy = _policy(tiny_cache, tiny_model_path, "model.sequence_packing=true")
    with pytest.raises(BatchContractError, match="count each row's real tokens from 0"):
        policy.compute_logprobs(batch)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["algorithm.max_tokens_per_microbatch=-1"], "max_tokens_per_microbatch must be >= 0"),
        (["algorithm.logprob_micro_batch_size=-2"], "logprob_micro_batch_size must be >= 0"),
        (
            ["model.backend=megatron", "model.sequence_packing=true"],
            "sequence_packing=true is for model.backend=hf: megatron runs packed sequences only with "
            "TransformerEngine's attention",
        ),
    ],
)
def test_bad_throughput_configs(overrides, match):
    with pytest.raises(ConfigError, match=match) as exc:
        load_config(overrides)
    assert "\n" not in str(exc.value)


def test_megatron_takes_token_budget_micro_batches():
    cfg = load_config(["model.backend=megatron", "algorithm.max_tokens_per_microbatch=512"])
    assert cfg.algorithm.max_tokens_per_microbatch == 512


def test_micro_batches_without_trained_tokens_are_skipped_exactly(tiny_cache, tiny_model_path, monkeypatch):
    """Rows with an all-zero loss mask (RLCR's greedy answers) filling whole micro-batches are not
    run: same gradients and metrics as the batch without them, log-probs 0 on their rows."""
    batch = _batch()
    untrained = batch.index([0, 1, 2, 3])
    untrained[F.LOSS_MASK] = torch.zeros_like(untrained[F.LOSS_MASK])
    untrained[F.ADVANTAGES] = torch.zeros_like(untrained[F.ADVANTAGES])
    mixed = Batch.concat([untrained, batch])  # micro-batches of 4: the first trains nothing
    with_rows = _policy(tiny_cache, tiny_model_path, "algorithm.micro_batch_size=4")
    without = _policy(tiny_cache, tiny_model_path, "algorithm.micro_batch_size=4")
    runs = []
    original = with_rows.micro_objective
    monkeypatch.setattr(
        with_rows, "micro_objective", lambda micro, **kw: runs.append(len(micro)) or original(micro, **kw)
    )
    n_tok = float(batch[F.LOSS_MASK].sum())
    m_with = with_rows.accumulate_gradients(mixed, num_tokens=n_tok, norm_length=16)
    m_without = without.accumulate_gradients(batch, num_tokens=n_tok, norm_length=16)
    assert runs == [4, 2]  # the untrained micro-batch never ran
    assert m_with["actor/loss"] == pytest.approx(m_without["actor/loss"], rel=1e-6)
    for p, q in zip(with_rows.model.parameters(), without.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-7, rtol=1e-6)
    lp = with_rows.compute_logprobs(mixed)
    assert lp[:4].abs().max() == 0
    torch.testing.assert_close(lp[4:, : batch.seq_len], without.compute_logprobs(batch), atol=2e-5, rtol=1e-5)
