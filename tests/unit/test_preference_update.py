"""The hf policy's preference step (DPO, IPO, KTO) on the tiny model: the first loss against the
formula (the policy is its own reference, so every margin is 0), the gradient independent of how
pairs are cut into micro-batches and equal to the loss over the whole batch at once, and training
that widens the chosen-over-rejected margin."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from nemo_azr.algorithms.preference import kto_loss, sequence_logps
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.capabilities import PreferencePolicy
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.models.hf.policy import HFPolicy
from nemo_azr.models.tiny import load_tokenizer

PAIRS = [  # (question, chosen answer, rejected answer)
    ("What is 2 + 3?", "5", "6"),
    ("What is 7 + 1?", "8", "9 or 8"),
    ("What is 4 + 4?", "8", "44"),
    ("What is 9 - 3?", "6", "12"),
]


def _policy(tiny_model_path, micro_batch_size: int = 8) -> HFPolicy:
    cfg = NemoAzrConfig()
    cfg.optim.lr = 1e-3
    cfg.optim.warmup_steps = 0
    cfg.algorithm.micro_batch_size = micro_batch_size
    policy = HFPolicy(tiny_model_path, cfg, trainable=True)
    policy.setup_optimizer(total_steps=100)
    return policy


def _batch(tiny_model_path, policy: HFPolicy) -> Batch:
    tok = load_tokenizer(tiny_model_path)
    prompts, responses, labels, pair_ids = [], [], [], []
    for i, (q, good, bad) in enumerate(PAIRS):
        for answer, label in ((bad, 0), (good, 1)):  # rejected first: the pairing must not rely on order
            prompts.append(tok(q, add_special_tokens=False)["input_ids"])
            responses.append(tok(" " + answer, add_special_tokens=False)["input_ids"])
            labels.append(label)
            pair_ids.append(f"pair{i}")
    batch = Batch(
        pack_prompt_response(prompts, responses, None, pad_id=tok.pad_token_id), {F.PAIR_ID: pair_ids}
    )
    batch[F.PREFERENCE_LABEL] = torch.tensor(labels)
    batch[F.REF_LOGPROBS] = policy.compute_logprobs(batch).detach().cpu()  # the policy is its own reference
    return batch


def test_the_hf_policy_has_the_preference_capability(tiny_model_path):
    assert isinstance(_policy(tiny_model_path), PreferencePolicy)


@pytest.mark.parametrize(("loss", "beta", "want"), [("dpo", 0.1, math.log(2.0)), ("ipo", 0.5, 1.0)])
def test_first_loss_equals_the_formula_at_zero_margin(tiny_model_path, loss, beta, want):
    """Policy = reference: every log-ratio is 0, so DPO is -log sigmoid(0) = log 2 and IPO is
    (0 - 1/(2 beta))^2."""
    policy = _policy(tiny_model_path)
    metrics = policy.preference_step(_batch(tiny_model_path, policy), loss=loss, beta=beta)
    assert metrics["preference/loss"] == pytest.approx(want, abs=1e-5)
    assert metrics["preference/reward_margin"] == pytest.approx(0.0, abs=1e-5)
    assert metrics["preference/pairs"] == len(PAIRS) and metrics["preference/grad_norm"] > 0


def test_rpo_adds_the_chosen_replies_per_token_nll(tiny_model_path):
    """Policy = reference: DPO is log 2, and RPO adds nll_weight x the mean over pairs of the chosen
    reply's -log pi / tokens, computed here from the policy's own token log-probs."""
    policy = _policy(tiny_model_path)
    batch = _batch(tiny_model_path, policy)
    chosen = batch[F.PREFERENCE_LABEL] == 1
    token_logps = policy.compute_logprobs(batch).detach().cpu()[chosen]
    mask = batch[F.LOSS_MASK][chosen].float()
    want_nll = float((-(token_logps * mask).sum(-1) / mask.sum(-1)).mean())
    metrics = policy.preference_step(batch, loss="dpo", beta=0.1, nll_weight=0.5)
    assert metrics["preference/chosen_nll"] == pytest.approx(want_nll, rel=1e-4)
    assert metrics["preference/loss"] == pytest.approx(math.log(2.0) + 0.5 * want_nll, rel=1e-4)
    with pytest.raises(ConfigError, match="nll_weight=0.5.*paired loss"):
        policy.preference_step(_kto_batch(tiny_model_path, policy), loss="kto", beta=0.1, nll_weight=0.5)


@pytest.mark.parametrize("nll_weight", [0.0, 1.0])
def test_gradient_does_not_depend_on_the_micro_batch_size(tiny_model_path, nll_weight):
    grads = []
    for rows in (2, 8):  # one pair per micro-batch, then all four pairs in one
        policy = _policy(tiny_model_path, micro_batch_size=rows)
        batch = _batch(tiny_model_path, policy)
        captured = {}

        def capture(policy=policy, captured=captured) -> float:
            for name, p in policy.model.named_parameters():
                if p.grad is not None:
                    captured[name] = p.grad.detach().clone()
            policy.optimizer.zero_grad(set_to_none=True)
            return 1.0

        policy._clip_and_step = capture
        policy.preference_step(batch, loss="dpo", beta=0.1, nll_weight=nll_weight)
        grads.append(captured)
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-4, atol=1e-7)


def test_dpo_steps_widen_the_chosen_over_rejected_margin(tiny_model_path):
    policy = _policy(tiny_model_path)
    batch = _batch(tiny_model_path, policy)
    chosen = batch[F.PREFERENCE_LABEL] == 1

    def margin() -> float:
        seq = sequence_logps(policy.compute_logprobs(batch).detach().cpu(), batch[F.LOSS_MASK])
        return float(seq[chosen].sum() - seq[~chosen].sum())

    before = margin()
    for _ in range(5):
        metrics = policy.preference_step(batch, loss="dpo", beta=0.1)
    assert margin() > before + 1.0
    assert metrics["preference/reward_accuracy"] == 1.0 and metrics["preference/loss"] < math.log(2.0)


def test_bad_preference_steps_name_what_is_wrong(tiny_model_path):
    policy = _policy(tiny_model_path)
    batch = _batch(tiny_model_path, policy)
    with pytest.raises(ConfigError, match="preference loss 'orpo'"):
        policy.preference_step(batch, loss="orpo", beta=0.1)
    with pytest.raises(BatchContractError, match="KTO needs per-row meta 'kl_row'"):
        policy.preference_step(batch, loss="kto", beta=0.1)
    no_ref = copy.copy(batch)
    no_ref.tensors = {k: v for k, v in batch.tensors.items() if k != F.REF_LOGPROBS}
    with pytest.raises(BatchContractError, match="missing key 'ref_logprobs'"):
        policy.preference_step(no_ref, loss="dpo", beta=0.1)


def _kto_batch(tiny_model_path, policy: HFPolicy) -> Batch:
    """The pairs' eight rows unpaired, then eight mismatched rows: row i's prompt with the answer of
    the next pair's row (hand-built here, the references the step must match)."""
    tok = load_tokenizer(tiny_model_path)
    rows = [(q, a, label) for q, good, bad in PAIRS for a, label in ((good, 1), (bad, 0))]
    mismatched = [(rows[i][0], rows[(i + 2) % len(rows)][1], 0) for i in range(len(rows))]
    prompts, responses, labels = [], [], []
    for q, a, label in rows + mismatched:
        prompts.append(tok(q, add_special_tokens=False)["input_ids"])
        responses.append(tok(" " + a, add_special_tokens=False)["input_ids"])
        labels.append(label)
    meta = {F.KL_ROW: [False] * len(rows) + [True] * len(mismatched)}
    batch = Batch(pack_prompt_response(prompts, responses, None, pad_id=tok.pad_token_id), meta)
    batch[F.PREFERENCE_LABEL] = torch.tensor(labels)
    batch[F.REF_LOGPROBS] = policy.compute_logprobs(batch).detach().cpu()
    return batch


def test_kto_first_loss_is_half_the_weights_at_the_reference(tiny_model_path):
    """Policy = reference: every log-ratio and z0 are 0, so each example's loss is
    lambda * (1 - sigmoid(0)) = lambda / 2; the mean over 4 desirable (lambda_D = 1) and 4
    undesirable (lambda_U = 1.5) rows is (4 * 0.5 + 4 * 0.75) / 8."""
    policy = _policy(tiny_model_path)
    metrics = policy.preference_step(
        _kto_batch(tiny_model_path, policy), loss="kto", beta=0.1, undesirable_weight=1.5
    )
    assert metrics["preference/loss"] == pytest.approx((4 * 0.5 + 4 * 0.75) / 8, abs=1e-6)
    assert metrics["preference/kl_reference"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["preference/examples"] == 8 and metrics["preference/grad_norm"] > 0


def _captured_kto_grads(tiny_model_path, micro_batch_size: int, *, shift_reference: bool) -> dict:
    policy = _policy(tiny_model_path, micro_batch_size=micro_batch_size)
    batch = _kto_batch(tiny_model_path, policy)
    if shift_reference:  # a reference unlike the policy, so z0 > 0 and no log-ratio is 0
        batch[F.REF_LOGPROBS] = batch[F.REF_LOGPROBS] - 0.3 * batch[F.LOSS_MASK] * torch.arange(len(batch))[
            :, None
        ] / len(batch)
    captured = {}

    def capture() -> float:
        for name, p in policy.model.named_parameters():
            if p.grad is not None:
                captured[name] = p.grad.detach().clone()
        policy.optimizer.zero_grad(set_to_none=True)
        return 1.0

    policy._clip_and_step = capture
    policy.preference_step(batch, loss="kto", beta=0.5)
    return captured


def test_kto_step_gradient_equals_the_loss_over_the_whole_batch(tiny_model_path):
    """Cut into micro-batches of 3 rows (z0 from every mismatched row, computed first) or not at all,
    the step's gradient equals autograd through ``kto_loss`` on the whole batch in one call."""
    small = _captured_kto_grads(tiny_model_path, 3, shift_reference=True)
    whole = _captured_kto_grads(tiny_model_path, 16, shift_reference=True)
    policy = _policy(tiny_model_path)
    batch = _kto_batch(tiny_model_path, policy)
    batch[F.REF_LOGPROBS] = batch[F.REF_LOGPROBS] - 0.3 * batch[F.LOSS_MASK] * torch.arange(len(batch))[
        :, None
    ] / len(batch)
    seq = sequence_logps(policy.token_logprobs(batch), batch[F.LOSS_MASK])
    ref = sequence_logps(batch[F.REF_LOGPROBS], batch[F.LOSS_MASK])
    n = len(batch) // 2
    loss, metrics = kto_loss(
        seq[:n], ref[:n], batch[F.PREFERENCE_LABEL][:n].bool(), seq[n:].detach(), ref[n:], beta=0.5
    )
    assert float(metrics["kl_reference"]) > 0
    loss.backward()
    for name, p in policy.model.named_parameters():
        if p.grad is None:
            continue
        torch.testing.assert_close(small[name], p.grad, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(whole[name], p.grad, rtol=1e-4, atol=1e-7)


def test_kto_steps_raise_desirable_and_lower_undesirable_responses(tiny_model_path):
    policy = _policy(tiny_model_path)
    batch = _kto_batch(tiny_model_path, policy)
    labelled = ~torch.tensor(batch.meta[F.KL_ROW])
    good = labelled & (batch[F.PREFERENCE_LABEL] == 1)
    bad = labelled & (batch[F.PREFERENCE_LABEL] == 0)
    before = sequence_logps(batch[F.REF_LOGPROBS], batch[F.LOSS_MASK])
    for _ in range(5):
        metrics = policy.preference_step(batch, loss="kto", beta=0.5)
    after = sequence_logps(policy.compute_logprobs(batch).detach().cpu(), batch[F.LOSS_MASK])
    assert float((after - before)[good].mean()) > float((after - before)[bad].mean()) + 0.5
    assert metrics["preference/reward_margin"] > 0 and metrics["preference/loss"] < 0.5
