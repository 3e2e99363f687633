"""Hierarchical RLCR advantages: hand-computed normalisations, per-answer isolation, the estimator."""

import math

import pytest
import torch

from nemo_azr.config.schema import AlgorithmConfig, RLCRConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.errors import BatchContractError
from nemo_azr.registry import ADVANTAGE_ESTIMATORS
from nemo_azr.rlcr import RLCR_INFO_KEY, answer_advantages, confidence_advantages

EPS = 1e-6


def test_answer_advantages_per_prompt_by_hand():
    # Rows of three prompts, interleaved on purpose: grouping is by id, never by position.
    rewards = [1, 1, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0]
    prompts = ["A", "B", "C", "A", "B", "C", "A", "B", "C", "A", "B", "C"]
    adv = answer_advantages(rewards, prompts, scale_std=True, eps=EPS)
    # A: [1, 0, 0, 0] -> mean 0.25, std sqrt(0.1875); B: all 1 (zero spread); C: [1, 0, 0, 0] as A.
    std = math.sqrt(0.1875)
    hi, lo = 0.75 / (std + EPS), -0.25 / (std + EPS)
    a = [adv[i].item() for i in (0, 3, 6, 9)]
    b = [adv[i].item() for i in (1, 4, 7, 10)]
    assert a == pytest.approx([hi, lo, lo, lo], rel=1e-6)
    assert b == [0.0, 0.0, 0.0, 0.0]  # zero spread: exactly 0
    assert hi == pytest.approx(math.sqrt(3), rel=1e-5)  # 0.75 / 0.4330


def test_answer_advantages_half_right_and_no_std():
    adv = answer_advantages([1, 0, 0, 1], ["p"] * 4, scale_std=True, eps=EPS)
    # mean 0.5, population std 0.5
    unit = 0.5 / (0.5 + EPS)
    assert adv.tolist() == pytest.approx([unit, -unit, -unit, unit])
    centred = answer_advantages([1, 0, 0, 1], ["p"] * 4, scale_std=False)
    assert centred.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_confidence_advantages_per_answer_by_hand():
    rewards = [0.96, 0.75, 1.0, 0.36, 0.75, 0.91, 0.64]
    answers = ["a0", "a1", "a2", "a0", "a1", "a2", "a2"]
    adv = confidence_advantages(rewards, answers, scale_std=True, eps=EPS)
    # a0: [0.96, 0.36] -> mean 0.66, std 0.3 -> +-0.3/0.3
    assert [adv[0].item(), adv[3].item()] == pytest.approx([0.3 / (0.3 + EPS), -0.3 / (0.3 + EPS)], rel=1e-6)
    # a1: equal rewards -> exactly 0
    assert [adv[1].item(), adv[4].item()] == [0.0, 0.0]
    # a2: [1.0, 0.91, 0.64] -> mean 0.85, deviations [0.15, 0.06, -0.21], std sqrt(0.0702 / 3)
    std = math.sqrt(0.0702 / 3)
    expected = [0.15 / (std + EPS), 0.06 / (std + EPS), -0.21 / (std + EPS)]
    assert [adv[2].item(), adv[5].item(), adv[6].item()] == pytest.approx(expected, rel=1e-5)
    assert expected[0] == pytest.approx(0.98058, rel=1e-4)
    centred = confidence_advantages(rewards, answers, scale_std=False)
    assert [centred[2].item(), centred[5].item(), centred[6].item()] == pytest.approx(
        [0.15, 0.06, -0.21], abs=1e-6
    )


def test_confidence_prompt_level_second_stage_by_hand():
    rewards = [0.96, 0.36, 0.5, 0.5]
    answers = ["a0", "a0", "a1", "a1"]
    stage1 = confidence_advantages(rewards, answers, eps=0.0)
    assert stage1.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.0])
    # stage 2 over the prompt: [1, -1, 0, 0] has mean 0 and std sqrt(0.5)
    stage2 = confidence_advantages(rewards, answers, eps=0.0, prompt_ids=["p"] * 4)
    assert stage2.tolist() == pytest.approx([math.sqrt(2), -math.sqrt(2), 0.0, 0.0], rel=1e-6)


def _tree_batch(conf_rewards: dict[str, list[float]], acc: dict[str, float], settings: RLCRConfig) -> Batch:
    """Answer rows then confidence rows (shuffled), each with 3 trained tokens of 5."""
    rows = [(aid, "answer", r, aid.split("-")[0]) for aid, r in acc.items()]
    for aid, values in conf_rewards.items():
        rows += [(aid, "confidence", v, aid.split("-")[0]) for v in values]
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(0)).tolist()
    rows = [rows[i] for i in order]
    mask = torch.tensor([[0, 0, 1, 1, 1]] * len(rows), dtype=torch.float32)
    return Batch(
        {
            F.INPUT_IDS: torch.ones(len(rows), 5, dtype=torch.long),
            F.ATTENTION_MASK: torch.ones(len(rows), 5, dtype=torch.long),
            F.LOSS_MASK: mask,
            F.REWARDS: torch.tensor([r[2] for r in rows], dtype=torch.float32),
        },
        {
            F.UID: [f"u{i}" for i in range(len(rows))],
            F.GROUP_ID: [r[3] for r in rows],
            F.SUBGROUP_ID: [r[0] for r in rows],
            F.SAMPLE_TYPE: [r[1] for r in rows],
        },
        {RLCR_INFO_KEY: settings},
    )


def _random_tree(seed: int):
    g = torch.Generator().manual_seed(seed)
    acc, conf = {}, {}
    for p in range(3):
        for k in range(4):
            aid = f"p{p}-a{k}"
            acc[aid] = float(torch.randint(0, 2, (1,), generator=g))
            c = torch.rand(4, generator=g)
            conf[aid] = [1 - (acc[aid] - float(x)) ** 2 for x in c]
    return acc, conf


def _row_adv(batch: Batch, settings: RLCRConfig) -> dict[tuple[str, str, int], float]:
    estimator = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")
    adv, _ = estimator(batch, AlgorithmConfig())
    seen: dict[tuple[str, str], int] = {}
    out = {}
    for i, (sub, kind) in enumerate(zip(batch[F.SUBGROUP_ID], batch[F.SAMPLE_TYPE])):
        n = seen[(sub, kind)] = seen.get((sub, kind), -1) + 1
        out[(sub, kind, n)] = float(adv[i, 2])
    return out


def test_confidence_batch_scale_keeps_baselines_and_ratios():
    """Mean-only baselines per answer, then one std over the whole step (hand-computed)."""
    # a0 (wrong answer): confidences 0.1 / 0.3 -> Brier 0.99 / 0.91; a1 (right): 0.9 / 0.3 -> 0.99 / 0.51.
    rewards = [0.99, 0.91, 0.99, 0.51]
    answers = ["a0", "a0", "a1", "a1"]
    centred = [0.04, -0.04, 0.24, -0.24]  # reward minus its own answer's mean
    std = math.sqrt(sum(c * c for c in centred) / 4)  # mean of the centred values is 0
    adv = confidence_advantages(rewards, answers, scale_std=False, eps=EPS, batch_scale=True)
    assert adv.tolist() == pytest.approx([c / (std + EPS) for c in centred], rel=1e-5)
    assert adv[2].item() / adv[0].item() == pytest.approx(6.0, rel=1e-5)  # Brier ratios kept
    # One scalar: doubling every reward difference leaves the scaled advantages unchanged.
    doubled = [0.99, 0.83, 0.99, 0.03]
    again = confidence_advantages(doubled, answers, scale_std=False, eps=EPS, batch_scale=True)
    assert again.tolist() == pytest.approx(adv.tolist(), rel=1e-5)
    flat = confidence_advantages([0.5, 0.5, 0.8, 0.8], answers, scale_std=False, batch_scale=True)
    assert flat.tolist() == [0.0, 0.0, 0.0, 0.0]  # no spread anywhere: exactly 0, never 0 / eps


def test_estimator_applies_conf_batch_scale_to_confidence_rows_only():
    settings = RLCRConfig(scale_std=False, conf_batch_scale=True, lambda_conf=2.0)
    acc = {"p0-a0": 0.0, "p0-a1": 1.0}
    conf = {"p0-a0": [0.99, 0.91], "p0-a1": [0.99, 0.51]}  # Brier of 0.1 / 0.3 (wrong), 0.9 / 0.3 (right)
    batch = _tree_batch(conf, acc, settings)
    adv, _ = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(batch, AlgorithmConfig())
    std = math.sqrt((2 * 0.04**2 + 2 * 0.24**2) / 4)
    for i, (kind, r) in enumerate(zip(batch[F.SAMPLE_TYPE], batch[F.REWARDS])):
        value = adv[i, 2].item()
        if kind == "answer":  # [0, 1], mean-only: -+0.5, untouched by the confidence scale
            assert value == pytest.approx(float(r) - 0.5)
        else:
            sub = batch[F.SUBGROUP_ID][i]
            mean = 0.95 if sub == "p0-a0" else 0.75
            assert value == pytest.approx(2.0 * (float(r) - mean) / (std + EPS), rel=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_confidence_advantage_depends_on_another_answers_confidences(seed):
    settings = RLCRConfig()
    acc, conf = _random_tree(seed)
    base = _row_adv(_tree_batch(conf, acc, settings), settings)
    target = "p1-a2"
    perturbed = dict(conf)
    perturbed[target] = [0.0, 1.0, 0.25, 0.5]  # change only this answer's confidence rewards
    after = _row_adv(_tree_batch(perturbed, acc, settings), settings)
    for key, value in base.items():
        if key[0] == target and key[1] == "confidence":
            continue
        assert after[key] == value, key  # bit-identical: other answers' rows and all answer rows
    changed = [k for k in base if k[0] == target and k[1] == "confidence" and base[k] != after[k]]
    assert changed, "the perturbed answer's own confidence advantages must change"


def test_prompt_level_norm_couples_answers_of_one_prompt():
    """The optional second stage shares one scale per prompt (why it is off by default); this also
    shows the isolation test above would catch coupling."""
    settings = RLCRConfig(conf_prompt_level_norm=True)
    acc, conf = _random_tree(0)
    base = _row_adv(_tree_batch(conf, acc, settings), settings)
    perturbed = dict(conf)
    perturbed["p1-a2"] = [0.0, 1.0, 0.25, 0.5]
    after = _row_adv(_tree_batch(perturbed, acc, settings), settings)
    same_prompt_other = [
        k for k in base if k[0].startswith("p1-") and k[0] != "p1-a2" and k[1] == "confidence"
    ]
    other_prompt = [k for k in base if not k[0].startswith("p1-")]
    assert any(after[k] != base[k] for k in same_prompt_other)
    assert all(after[k] == base[k] for k in other_prompt)


def test_estimator_scales_by_lambda_and_projects_onto_mask():
    settings = RLCRConfig(lambda_ans=2.0, lambda_conf=0.5)
    acc = {"p0-a0": 1.0, "p0-a1": 0.0}
    conf = {"p0-a0": [0.96, 0.36], "p0-a1": [0.75, 0.75]}
    batch = _tree_batch(conf, acc, settings)
    adv, returns = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(batch, AlgorithmConfig())
    assert adv.shape == (len(batch), 5) and adv.dtype == torch.float32
    assert torch.equal(adv[:, :2], torch.zeros(len(batch), 2))  # prompt columns (mask 0) stay 0
    for i, (sub, kind, r) in enumerate(zip(batch[F.SUBGROUP_ID], batch[F.SAMPLE_TYPE], batch[F.REWARDS])):
        if kind == "answer":  # [1, 0] -> +-1 scaled by 2
            expected = 2.0 * (1.0 if sub == "p0-a0" else -1.0) * 0.5 / (0.5 + 1e-6)
        elif sub == "p0-a0":  # [0.96, 0.36] -> +-1 scaled by 0.5
            expected = 0.5 * (1.0 if abs(float(r) - 0.96) < 1e-6 else -1.0) * 0.3 / (0.3 + 1e-6)
        else:
            expected = 0.0
        assert adv[i, 2:].tolist() == pytest.approx([expected] * 3, rel=1e-5)
    assert torch.equal(returns, adv)


def test_estimator_rejects_unknown_sample_type_and_missing_subgroup():
    settings = RLCRConfig()
    batch = _tree_batch({"p0-a0": [0.5, 0.7]}, {"p0-a0": 1.0}, settings)
    estimator = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")
    bad = Batch(dict(batch.tensors), {**batch.meta, F.SAMPLE_TYPE: ["proposal"] * len(batch)}, batch.info)
    with pytest.raises(BatchContractError, match="sample_type"):
        estimator(bad, AlgorithmConfig())
    meta = {k: v for k, v in batch.meta.items() if k != F.SUBGROUP_ID}
    with pytest.raises(BatchContractError, match="subgroup_id"):
        estimator(Batch(dict(batch.tensors), meta, batch.info), AlgorithmConfig())


def test_expected_confidence_advantages_by_hand():
    from nemo_azr.rlcr.advantages import expected_confidence_advantages

    # answer "a" right (acc 1), "b" wrong (acc 0); candidates 0.0 / 0.5 / 1.0, interleaved rows
    probs = {"a": [0.2, 0.3, 0.5], "b": [0.6, 0.3, 0.1]}
    cands = [0.0, 0.5, 1.0]
    rows = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    acc = {"a": 1.0, "b": 0.0}
    rewards = [1 - (acc[k] - cands[j]) ** 2 for k, j in rows]
    # log-probs of the candidates need not sum to 1 over them: they are renormalised
    logprobs = [math.log(0.5 * probs[k][j]) for k, j in rows]
    adv = expected_confidence_advantages(rewards, logprobs, [k for k, _ in rows])
    # a: R = [0, 0.75, 1], V = 0.2*0 + 0.3*0.75 + 0.5*1 = 0.725
    # b: R = [1, 0.75, 0], V = 0.6*1 + 0.3*0.75 + 0.1*0 = 0.825
    expected = {
        ("a", 0): 0.2 * (0 - 0.725),
        ("a", 1): 0.3 * (0.75 - 0.725),
        ("a", 2): 0.5 * (1 - 0.725),
        ("b", 0): 0.6 * (1 - 0.825),
        ("b", 1): 0.3 * (0.75 - 0.825),
        ("b", 2): 0.1 * (0 - 0.825),
    }
    assert adv.tolist() == pytest.approx([expected[r] for r in rows], abs=1e-6)
    with pytest.raises(BatchContractError, match="log-probs"):
        expected_confidence_advantages([1.0, 0.0], [0.0], ["a", "a"])


def test_expected_advantages_under_the_ppo_ratio_are_the_exact_expected_brier_gradient():
    """-sum_c (pi(c) / pi_old(c)) * A(c) at pi = pi_old has the gradient of -E[R | a candidate] under
    pi (torch autograd of the expectation as the reference), also when the candidates hold only
    part of the policy's mass."""
    from nemo_azr.rlcr.advantages import expected_confidence_advantages

    torch.manual_seed(0)
    theta = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)  # two answers, a 7-token vocab
    cands = [1, 3, 4, 6]  # the candidates' tokens
    rewards = torch.tensor([[0.1, 0.9, 0.4, 0.6], [0.8, 0.0, 0.3, 0.5]], dtype=torch.float64)

    logp = theta.log_softmax(-1)[:, cands]
    adv = expected_confidence_advantages(
        rewards.reshape(-1), logp.detach().reshape(-1), ["a"] * 4 + ["b"] * 4
    ).to(torch.float64)
    surrogate = -((logp - logp.detach()).exp().reshape(-1) * adv).sum()
    (grad,) = torch.autograd.grad(surrogate, theta)

    p = theta.softmax(-1)[:, cands]
    expected_reward = ((p / p.sum(-1, keepdim=True)) * rewards).sum()
    (reference,) = torch.autograd.grad(-expected_reward, theta)
    torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)
    assert reference.abs().sum() > 0


def test_uniform_candidate_weighting_by_hand():
    from nemo_azr.rlcr.advantages import expected_confidence_advantages

    # the rows of the test above: uniform weights ignore the log-probs, w = 1/3 within each answer
    cands = [0.0, 0.5, 1.0]
    rows = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    acc = {"a": 1.0, "b": 0.0}
    rewards = [1 - (acc[k] - cands[j]) ** 2 for k, j in rows]
    logprobs = [-0.1, -5.0, -3.0, -0.2, -9.0, -1.0]
    adv = expected_confidence_advantages(rewards, logprobs, [k for k, _ in rows], weighting="uniform")
    # a: R = [0, 0.75, 1], mean 1.75/3; b: R = [1, 0.75, 0], mean 1.75/3
    mean = 1.75 / 3
    expected = {
        ("a", 0): (0 - mean) / 3,
        ("a", 1): (0.75 - mean) / 3,
        ("a", 2): (1 - mean) / 3,
        ("b", 0): (1 - mean) / 3,
        ("b", 1): (0.75 - mean) / 3,
        ("b", 2): (0 - mean) / 3,
    }
    assert adv.tolist() == pytest.approx([expected[r] for r in rows], abs=1e-6)
    with pytest.raises(ValueError, match="weighting"):
        expected_confidence_advantages(rewards, logprobs, [k for k, _ in rows], weighting="softmax")


def _train_confidence_logits(weighting: str, accuracy: float, steps: int, lr: float) -> torch.Tensor:
    """Logits over the eleven candidates 0.0-1.0 for one context whose answers are right with
    probability ``accuracy``, trained by gradient descent on the PPO surrogate of the enumerated
    advantages (each step one right and one wrong answer, weighed by ``accuracy``), starting almost
    surely at 0.9: the state of a confidence turn that writes one value for every answer."""
    from nemo_azr.rlcr.advantages import expected_confidence_advantages

    cands = torch.linspace(0, 1, 11, dtype=torch.float64)
    logits = torch.full((11,), -6.0, dtype=torch.float64)
    logits[9] = 6.0
    logits.requires_grad_(True)
    for _ in range(steps):
        logp = logits.log_softmax(-1)
        loss = torch.zeros((), dtype=torch.float64)
        for right, share in ((1.0, accuracy), (0.0, 1 - accuracy)):
            rewards = 1 - (right - cands) ** 2
            adv = expected_confidence_advantages(rewards, logp.detach(), ["x"] * 11, weighting=weighting)
            loss = loss - share * ((logp - logp.detach()).exp() * adv.to(torch.float64)).sum()
        (grad,) = torch.autograd.grad(loss, logits)
        with torch.no_grad():
            logits -= lr * grad
    return logits.detach()


def test_uniform_weighting_moves_a_one_value_policy_to_the_brier_best_candidate():
    """Where the policy writes 0.9 almost surely and the answers are right 30% of the time, the
    policy-weighted (exact) gradient does not move its likeliest value in 400 steps, while uniform weights move its
    likeliest value to 0.3, the candidate with the best expected Brier reward (1 - E(y - c)^2 is
    largest at c = P(right))."""
    uniform = _train_confidence_logits("uniform", accuracy=0.3, steps=400, lr=3.0)
    policy = _train_confidence_logits("policy", accuracy=0.3, steps=400, lr=3.0)
    assert int(uniform.argmax()) == 3
    assert int(policy.argmax()) == 9


def test_contrast_candidate_advantages_by_hand():
    from nemo_azr.rlcr.advantages import contrast_confidence_advantages

    # a right and a wrong answer, candidates 0.0 / 0.5 / 1.0, interleaved rows; per value the batch
    # means are 0.5 / 0.75 / 0.5, so right: [-0.5, 0, 0.5] / 3 and wrong: [0.5, 0, -0.5] / 3,
    # i.e. (y - mean y)(2c - 1) / K
    cands = [0.0, 0.5, 1.0]
    rows = [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2)]
    acc = {"a": 1.0, "b": 0.0}
    rewards = [1 - (acc[k] - cands[j]) ** 2 for k, j in rows]
    adv = contrast_confidence_advantages(rewards, [cands[j] for _, j in rows], [k for k, _ in rows])
    expected = [(acc[k] - 0.5) * (2 * cands[j] - 1) / 3 for k, j in rows]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    # every answer right: nothing tells them apart, nothing moves
    same = contrast_confidence_advantages([0.0, 0.75, 1.0] * 2, cands * 2, ["a"] * 3 + ["b"] * 3)
    assert same.abs().max() == 0
    with pytest.raises(BatchContractError, match="candidate values"):
        contrast_confidence_advantages([1.0, 0.0], [0.0], ["a", "a"])


def test_candidate_mass_advantages_are_the_gradient_of_the_log_mass():
    """``coef * pi~(c)`` under the PPO ratio has the gradient of ``-coef * log sum_c pi(c)`` (torch
    autograd of the log mass as the reference), the candidates holding part of the mass; by hand:
    pi~ = [0.2, 0.6, 0.2] gives [0.1, 0.3, 0.1] at coef 0.5, whatever the mass outside."""
    from nemo_azr.rlcr.advantages import candidate_mass_advantages

    torch.manual_seed(1)
    theta = torch.randn(2, 7, dtype=torch.float64, requires_grad=True)  # two answers, a 7-token vocab
    cands = [0, 2, 5]
    logp = theta.log_softmax(-1)[:, cands]
    adv = candidate_mass_advantages(logp.detach().reshape(-1), ["a"] * 3 + ["b"] * 3, 0.7).to(torch.float64)
    surrogate = -((logp - logp.detach()).exp().reshape(-1) * adv).sum()
    (grad,) = torch.autograd.grad(surrogate, theta)
    mass = theta.softmax(-1)[:, cands].sum(-1)
    (reference,) = torch.autograd.grad(-0.7 * mass.log().sum(), theta)
    torch.testing.assert_close(grad, reference, rtol=1e-5, atol=1e-6)
    assert reference.abs().sum() > 0

    by_hand = candidate_mass_advantages([math.log(0.02), math.log(0.06), math.log(0.02)], ["x"] * 3, 0.5)
    assert by_hand.tolist() == pytest.approx([0.1, 0.3, 0.1], abs=1e-6)
    assert candidate_mass_advantages([], [], 0.5).numel() == 0


def _enumerated_batch(
    settings: RLCRConfig, with_accuracy: bool = False
) -> tuple[Batch, list[tuple[str, float]]]:
    """One prompt, a right answer "a" and a wrong one "b", candidates 0.0 / 0.5 / 1.0 after each with
    one-token log-probs (rows in a shuffled order, as the workflow may hand them over)."""
    from nemo_azr.rlcr.common import ANSWER_CORRECT, CANDIDATE_OF, CONFIDENCE

    probs = {"a": [0.1, 0.2, 0.5], "b": [0.3, 0.3, 0.2]}  # 0.8 of the mass on the candidates each
    acc = {"a": 1.0, "b": 0.0}
    cands = [0.0, 0.5, 1.0]
    rows = [("b", 1), ("a", 0), ("a", 2), ("b", 0), ("a", 1), ("b", 2)]
    logprobs = torch.zeros(len(rows), 3)
    logprobs[:, 2] = torch.tensor([math.log(probs[k][j]) for k, j in rows])
    batch = Batch(
        {
            F.INPUT_IDS: torch.ones(len(rows), 3, dtype=torch.long),
            F.ATTENTION_MASK: torch.ones(len(rows), 3, dtype=torch.long),
            F.LOSS_MASK: torch.tensor([[0, 0, 1]] * len(rows), dtype=torch.float32),
            F.REWARDS: torch.tensor([1 - (acc[k] - cands[j]) ** 2 for k, j in rows]),
            F.OLD_LOGPROBS: logprobs,
        },
        {
            F.UID: [f"u{i}" for i in range(len(rows))],
            F.GROUP_ID: ["p0"] * len(rows),
            F.SUBGROUP_ID: [k for k, _ in rows],
            F.SAMPLE_TYPE: ["confidence"] * len(rows),
            CANDIDATE_OF: [k for k, _ in rows],
            CONFIDENCE: [cands[j] for _, j in rows],
        },
        {RLCR_INFO_KEY: settings},
    )
    if with_accuracy:
        batch.meta[ANSWER_CORRECT] = [acc[k] for k, _ in rows]
    return batch, [(k, cands[j]) for k, j in rows]


def _contrast_settings(**extra: float) -> RLCRConfig:
    """Enumerated candidates, uniform weights, the batch contrast, lambda_conf 2, plus ``extra``."""
    return RLCRConfig(
        confidence_decoding="enumerate",
        candidate_weighting="uniform",
        candidate_baseline="batch",
        lambda_conf=2.0,
        **extra,
    )


def test_estimator_adds_the_candidate_mass_term_to_the_contrast_by_hand():
    settings = _contrast_settings(candidate_mass_coef=0.4)
    batch, rows = _enumerated_batch(settings)
    adv, _ = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(batch, AlgorithmConfig())
    # contrast (y - 0.5)(2c - 1) / 3; mass 0.4 * pi~: a [1/8, 2/8, 5/8], b [3/8, 3/8, 2/8]; times 2
    share = {"a": [0.125, 0.25, 0.625], "b": [0.375, 0.375, 0.25]}
    y = {"a": 1.0, "b": 0.0}
    expected = [2.0 * ((y[k] - 0.5) * (2 * c - 1) / 3 + 0.4 * share[k][int(c * 2)]) for k, c in rows]
    assert adv[:, 2].tolist() == pytest.approx(expected, abs=1e-6)
    assert adv[:, :2].abs().max() == 0
    without = RLCRConfig(**{**settings.__dict__, "candidate_mass_coef": 0.0})
    plain, _ = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(_enumerated_batch(without)[0], AlgorithmConfig())
    contrast = [2.0 * (y[k] - 0.5) * (2 * c - 1) / 3 for k, c in rows]
    assert plain[:, 2].tolist() == pytest.approx(contrast, abs=1e-6)


def test_candidate_level_advantages_by_hand():
    """pi~: a [1/8, 2/8, 5/8] (e = 0.75), b [3/8, 3/8, 2/8] (e = 0.4375); mean e 0.59375, accuracy
    0.5: every candidate gets coef * 2 * (0.5 - 0.59375) * (c - 0.5) / 3, right and wrong alike."""
    from nemo_azr.rlcr.advantages import candidate_level_advantages

    probs = {"a": [0.1, 0.2, 0.5], "b": [0.3, 0.3, 0.2]}
    rows = [("b", 1), ("a", 0), ("a", 2), ("b", 0), ("a", 1), ("b", 2)]
    cands = [0.0, 0.5, 1.0]
    adv = candidate_level_advantages(
        [{"a": 1.0, "b": 0.0}[k] for k, _ in rows],
        [cands[j] for _, j in rows],
        [math.log(probs[k][j]) for k, j in rows],
        [k for k, _ in rows],
        0.8,
    )
    assert adv.tolist() == pytest.approx(
        [0.8 * 2 * -0.09375 * (cands[j] - 0.5) / 3 for _, j in rows], abs=1e-7
    )
    # the level already at the accuracy: nothing moves
    even = candidate_level_advantages(
        [1.0] * 3 + [0.0] * 3, cands * 2, [math.log(1 / 3)] * 6, ["a"] * 3 + ["b"] * 3, 1.0
    )
    assert even.abs().max() == 0
    with pytest.raises(BatchContractError, match="accuracies"):
        candidate_level_advantages([1.0], cands, [0.0] * 3, ["a"] * 3, 1.0)
    assert candidate_level_advantages([], [], [], [], 1.0).numel() == 0


def test_candidate_level_term_pulls_the_mean_confidence_to_the_accuracy():
    """Two answers (right, wrong), every candidate 0.0-1.0, each policy starting with its mass on 0.1:
    steps on the level advantages alone (under the PPO ratio, torch autograd) bring the mean expected
    confidence from 0.1 to the step's accuracy 0.5 and leave the two answers' expectations equal."""
    from nemo_azr.rlcr.advantages import candidate_level_advantages

    cands = [round(0.1 * i, 1) for i in range(11)]
    logits = torch.full((2, 11), -4.0, dtype=torch.float64)
    logits[:, 1] = 4.0
    logits.requires_grad_(True)
    ids = ["right"] * 11 + ["wrong"] * 11
    correct = [1.0] * 11 + [0.0] * 11
    values = torch.tensor(cands * 2, dtype=torch.float64)
    optimizer = torch.optim.SGD([logits], lr=5.0)
    for _ in range(400):
        logp = logits.log_softmax(-1).reshape(-1)
        adv = candidate_level_advantages(correct, cands * 2, logp.detach(), ids, 1.0).to(torch.float64)
        optimizer.zero_grad()
        (-((logp - logp.detach()).exp() * adv).sum()).backward()
        optimizer.step()
    expected = (logits.softmax(-1) * values[:11]).sum(-1).detach()
    assert float(expected.mean()) == pytest.approx(0.5, abs=0.02)
    assert float(expected[0]) == pytest.approx(float(expected[1]), abs=1e-9)


def test_estimator_adds_the_candidate_level_term_by_hand():
    settings = _contrast_settings(candidate_level_coef=0.8)
    batch, rows = _enumerated_batch(settings, with_accuracy=True)
    adv, _ = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(batch, AlgorithmConfig())
    y = {"a": 1.0, "b": 0.0}
    level = 0.8 * 2 * (0.5 - 0.59375) / 3
    expected = [2.0 * ((y[k] - 0.5) * (2 * c - 1) / 3 + level * (c - 0.5)) for k, c in rows]
    assert adv[:, 2].tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(BatchContractError, match="answer_correct"):
        ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(_enumerated_batch(settings)[0], AlgorithmConfig())


def test_contrast_within_each_stratum_by_hand():
    """``strata`` (rlcr.candidate_baseline=kind): kind X has a right answer "a" and a wrong one "b",
    kind Y two right answers "c", "d"; candidates 0.0 / 0.5 / 1.0. Within X the contrast is
    (y - 0.5)(2c - 1) / 3; within Y every answer is right, so nothing tells them apart and nothing
    moves. Over the whole batch (mean y 0.75) the same rows get (y - 0.75)(2c - 1) / 3: Y's
    right answers push up only because their kind is easier."""
    from nemo_azr.rlcr.advantages import contrast_confidence_advantages

    cands = [0.0, 0.5, 1.0]
    acc = {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0}
    kind = {"a": "X", "b": "X", "c": "Y", "d": "Y"}
    rows = [(k, j) for j in range(3) for k in "dbca"]  # interleaved: value-major, kinds mixed
    rewards = [1 - (acc[k] - cands[j]) ** 2 for k, j in rows]
    values = [cands[j] for _, j in rows]
    ids = [k for k, _ in rows]
    adv = contrast_confidence_advantages(rewards, values, ids, [kind[k] for k in ids])
    by_hand = [(acc[k] - 0.5) * (2 * cands[j] - 1) / 3 if kind[k] == "X" else 0.0 for k, j in rows]
    assert adv.tolist() == pytest.approx(by_hand, abs=1e-6)
    whole = contrast_confidence_advantages(rewards, values, ids)
    assert whole.tolist() == pytest.approx(
        [(acc[k] - 0.75) * (2 * cands[j] - 1) / 3 for k, j in rows], abs=1e-6
    )
    with pytest.raises(BatchContractError, match="strata"):
        contrast_confidence_advantages(rewards, values, ids, ["X"])


def test_candidate_level_within_each_stratum_by_hand():
    """pi~: a [1/8, 2/8, 5/8] (e 0.75, right), b [3/8, 3/8, 2/8] (e 0.4375, wrong) in kind X (accuracy
    0.5, mean e 0.59375); c uniform (e 0.5, right) alone in kind Y (accuracy 1, mean e 0.5). Each
    answer's candidates get coef * 2 * (its kind's accuracy - its kind's mean e) * (c - 0.5) / 3."""
    from nemo_azr.rlcr.advantages import candidate_level_advantages

    probs = {"a": [0.1, 0.2, 0.5], "b": [0.3, 0.3, 0.2], "c": [0.2, 0.2, 0.2]}
    acc = {"a": 1.0, "b": 0.0, "c": 1.0}
    kind = {"a": "X", "b": "X", "c": "Y"}
    gap = {"X": 0.5 - 0.59375, "Y": 1.0 - 0.5}
    rows = [("b", 1), ("c", 0), ("a", 0), ("a", 2), ("c", 2), ("b", 0), ("a", 1), ("b", 2), ("c", 1)]
    cands = [0.0, 0.5, 1.0]
    args = (
        [acc[k] for k, _ in rows],
        [cands[j] for _, j in rows],
        [math.log(probs[k][j]) for k, j in rows],
        [k for k, _ in rows],
        0.8,
    )
    adv = candidate_level_advantages(*args, [kind[k] for k, _ in rows])
    assert adv.tolist() == pytest.approx(
        [0.8 * 2 * gap[kind[k]] * (cands[j] - 0.5) / 3 for k, j in rows], abs=1e-7
    )
    # one stratum: the batch's accuracy 2/3 against its mean e (0.75 + 0.4375 + 0.5) / 3
    whole = candidate_level_advantages(*args)
    assert whole.tolist() == pytest.approx(
        [0.8 * 2 * (2 / 3 - 1.6875 / 3) * (cands[j] - 0.5) / 3 for _, j in rows], abs=1e-7
    )
    with pytest.raises(BatchContractError, match="share its stratum"):
        candidate_level_advantages(*args, ["Y"] + [kind[k] for k, _ in rows[1:]])  # one of b's rows in Y


def test_estimator_with_the_kind_baseline_by_hand():
    """rlcr.candidate_baseline=kind through the estimator: the two answers of _enumerated_batch in
    one kind give the batch contrast and level (it is the whole batch); in two kinds each answer is
    alone in its kind, so the contrast is 0 and each level term pulls its own expectation to its
    own accuracy. A task without kinds is told to use the batch baseline."""
    from nemo_azr.rlcr.common import QUESTION_KIND

    settings = _contrast_settings(candidate_level_coef=0.8)
    kind_settings = RLCRConfig(**{**settings.__dict__, "candidate_baseline": "kind"})
    estimator = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")
    batch, rows = _enumerated_batch(kind_settings, with_accuracy=True)
    batch.meta[QUESTION_KIND] = ["lookup"] * len(rows)
    same_kind, _ = estimator(batch, AlgorithmConfig())
    whole, _ = estimator(_enumerated_batch(settings, with_accuracy=True)[0], AlgorithmConfig())
    torch.testing.assert_close(same_kind, whole, rtol=0, atol=1e-7)

    batch.meta[QUESTION_KIND] = [k for k, _ in rows]  # "a" and "b" each their own kind
    apart, _ = estimator(batch, AlgorithmConfig())
    e = {"a": 0.75, "b": 0.4375}
    y = {"a": 1.0, "b": 0.0}
    expected = [2.0 * 0.8 * 2 * (y[k] - e[k]) * (c - 0.5) / 3 for k, c in rows]
    assert apart[:, 2].tolist() == pytest.approx(expected, abs=1e-6)

    batch.meta[QUESTION_KIND] = [None] * len(rows)
    with pytest.raises(BatchContractError, match="rlcr.candidate_baseline=batch"):
        estimator(batch, AlgorithmConfig())


def _lookup_batch(settings: RLCRConfig) -> tuple[Batch, list[tuple[str, float]]]:
    """Two contexts of 10 answers each, right 3 and 7 times (the batch's accuracy 0.5), the 11
    candidates 0.0-1.0 after every answer, all equally likely."""
    from nemo_azr.rlcr.common import CANDIDATE_OF, CONFIDENCE

    cands = [round(0.1 * i, 1) for i in range(11)]
    rows, rewards = [], []
    for context, right in (("low", 3), ("high", 7)):
        for k in range(10):
            y = float(k < right)
            for c in cands:
                rows.append((f"{context}-{k}", context, c))
                rewards.append(1 - (y - c) ** 2)
    n = len(rows)
    batch = Batch(
        {
            F.INPUT_IDS: torch.ones(n, 2, dtype=torch.long),
            F.ATTENTION_MASK: torch.ones(n, 2, dtype=torch.long),
            F.LOSS_MASK: torch.tensor([[0, 1]] * n, dtype=torch.float32),
            F.REWARDS: torch.tensor(rewards),
            F.OLD_LOGPROBS: torch.full((n, 2), -math.log(11)),
        },
        {
            F.UID: [f"u{i}" for i in range(n)],
            F.GROUP_ID: [r[0] for r in rows],
            F.SUBGROUP_ID: [r[0] for r in rows],
            F.SAMPLE_TYPE: ["confidence"] * n,
            CANDIDATE_OF: [r[0] for r in rows],
            CONFIDENCE: [r[2] for r in rows],
        },
        {RLCR_INFO_KEY: settings},
    )
    return batch, [(r[1], r[2]) for r in rows]


@pytest.mark.parametrize(
    ("baseline", "share", "best"),
    [("answer", 1.0, (0.3, 0.7)), ("batch", 0.5, (0.1, 0.9)), ("batch", 1.0, (0.0, 1.0))],
)
def test_batch_share_spreads_each_contexts_best_value_around_the_base_rate(baseline, share, best):
    """With uniform weights the advantages sum to 0 over an answer's candidates, so each logit moves
    by its candidate's mean advantage over the context's answers and the likeliest value becomes the
    one with the largest. Contexts right 30% and 70% of the time (base 0.5): the answer baseline's best
    values are their accuracies; a batch share s moves them to 0.5 + (p - 0.5) / (1 - s) (0.1 and 0.9
    at s = 0.5, the grid's ends at s = 1)."""
    settings = RLCRConfig(
        confidence_decoding="enumerate",
        candidate_weighting="uniform",
        candidate_baseline=baseline,
        candidate_batch_share=share,
    )
    batch, rows = _lookup_batch(settings)
    adv, _ = ADVANTAGE_ESTIMATORS.get("rlcr_hierarchical")(batch, AlgorithmConfig())
    push: dict[tuple[str, float], float] = {}
    for (context, value), a in zip(rows, adv[:, 1].tolist()):
        push[(context, value)] = push.get((context, value), 0.0) + a
    got = tuple(
        max((v for c, v in push if c == context), key=lambda v: push[(context, v)])
        for context in ("low", "high")
    )
    assert got == best
