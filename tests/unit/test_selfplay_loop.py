"""The re-propose loop and the joint batch, driven by a scripted domain and backend.

With rollout_n = 4 and the seeds' band [0.3, 0.7], a question is learnable only when exactly 2 of
its 4 responses are safe and exactly 2 are incomplete.
"""

from types import SimpleNamespace

import pytest
import torch

from nemo_azr.algorithms.per_role import role_split_estimator
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.contracts.schema import STEP_ROLE_ADVANTAGE_SCALES
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.selfplay import AbsoluteZeroWorkflow
from nemo_azr.selfplay.config_check import check_absolute_zero_config
from tests.unit.selfplay_fakes import (
    LOGPROB,
    OBSERVATION,
    ScriptedBackend,
    ScriptedDomain,
    group_text,
    question,
)
from tests.unit.selfplay_fakes import make_cfg as fake_cfg

N = 4
LEARNABLE = question("L", [1, 1, 0, 0], [0, 0, 1, 1])  # safe 0.5, incomplete 0.5
TOO_EASY = question("E", [1, 1, 1, 1], [1, 1, 1, 1])  # safe 1.0, incomplete 0.0
MIXED = group_text(LEARNABLE, TOO_EASY)
ALL_LEARNABLE = group_text(LEARNABLE, LEARNABLE)
NONE_LEARNABLE = group_text(TOO_EASY, TOO_EASY)
GARBAGE = "not json at all"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def make_cfg(**az) -> NemoAzrConfig:
    return fake_cfg(N, **az)


def run_step(tokenizer, plans, **az):
    cfg = make_cfg(**az)
    domain = ScriptedDomain(list(plans))
    workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, cfg)
    backend = ScriptedBackend(tokenizer, plans)
    batch = workflow.run(domain.seed_tasks(), backend, SamplingParams(n=N, max_new_tokens=8), step=3)
    return batch, backend, cfg


def test_only_flagged_groups_are_reproposed_and_the_loop_is_bounded(tokenizer):
    plans = {
        "A": [MIXED],  # fine at once
        "B": [NONE_LEARNABLE, MIXED],  # fine after one re-proposal
        "C": [GARBAGE, ALL_LEARNABLE, NONE_LEARNABLE, ALL_LEARNABLE],  # never fine
    }
    batch, backend, _ = run_step(tokenizer, plans, max_repropose_attempts=3)
    proposes = [seeds for kind, seeds in backend.calls if kind == "propose"]
    assert proposes == [["A", "B", "C"], ["B", "C"], ["C"], ["C"]]
    solves = [n for kind, n in backend.calls if kind == "solve"]
    # questions x rollout_n of the groups proposed in that round (C's garbage has no questions)
    assert solves == [(2 + 2) * N, (2 + 2) * N, 2 * N, 2 * N]
    assert all(not plan for plan in backend.plans.values())  # every planned proposal was used
    m = batch.info["metrics"]
    assert m["repropose/total_attempts"] == 3
    assert m["repropose/groups_reproposed"] == 2 + 1 + 1
    assert m["repropose/final_non_learnable"] == 1
    assert m["unified_filter/initial_num_repropose"] == 2
    assert m["proposer/num_trajectories"] == 3 + 2 + 1 + 1
    assert m["proposer/num_unparseable"] == 1
    # final groups: A mixed, B mixed, C all learnable (2 questions each)
    assert m["unified_filter/num_total"] == 6
    assert m["unified_filter/num_learnable"] == 1 + 1 + 2
    assert m["unified_filter/learnable_ratio"] == pytest.approx(4 / 6)
    assert m["unified_filter/num_sampled"] == 2
    assert m["unified_filter/num_repropose"] == 1
    # first pass: A mixed (1 of 2), B none (0 of 2), C garbage (no questions)
    assert m["unified_filter/initial_learnable_ratio"] == pytest.approx(1 / 4)
    # ... the other three are TOO_EASY: safe 1.0 above the band and incomplete 0.0 below it
    assert m["unified_filter/initial_too_safe_share"] == pytest.approx(3 / 4)
    assert m["unified_filter/initial_too_complete_share"] == pytest.approx(3 / 4)
    assert (
        m["unified_filter/initial_too_unsafe_share"] == m["unified_filter/initial_too_incomplete_share"] == 0
    )


def test_zero_attempts_never_reproposes(tokenizer):
    batch, backend, _ = run_step(tokenizer, {"A": [MIXED], "B": [NONE_LEARNABLE]}, max_repropose_attempts=0)
    assert [k for k, _ in backend.calls] == ["propose", "solve"]
    assert batch.info["metrics"]["repropose/total_attempts"] == 0
    assert batch.info["absolute_zero"]["proposer_rewards"] == {"A": 1.0, "B": -0.5}


def test_joint_batch_rows_rewards_and_alignment(tokenizer):
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE, NONE_LEARNABLE], "C": [MIXED]}
    batch, _, cfg = run_step(tokenizer, plans, max_repropose_attempts=1)
    roles, pids = batch[F.ROLE], batch[F.PROMPT_ID]
    proposer_rows = [i for i, r in enumerate(roles) if r == "proposer"]
    solver_rows = [i for i, r in enumerate(roles) if r == "solver"]
    # each prompt's proposer trajectory appears exactly once; B keeps its last (failed) proposal
    assert sorted(pids[i] for i in proposer_rows) == ["A", "B", "C"]
    # solver rows: rollout_n per prompt with a sampled question; none for B
    assert sorted(pids[i] for i in solver_rows) == ["A"] * N + ["C"] * N
    for pid in ("A", "C"):
        (p_row,) = [i for i in proposer_rows if pids[i] == pid]
        s_rows = [i for i in solver_rows if pids[i] == pid]
        assert {batch[F.QUESTION_ID][i] for i in s_rows} == {batch[F.QUESTION_ID][p_row]}
        assert len({batch[F.GROUP_ID][i] for i in s_rows}) == 1
    assert len({batch[F.GROUP_ID][i] for i in proposer_rows}) == 1  # normalised across proposers
    rewards = batch[F.REWARDS].tolist()
    az = cfg.absolute_zero
    # the only learnable question of MIXED is LEARNABLE: safety [1,1,0,0], completion [0,0,1,1]
    for pid in ("A", "C"):
        s_rows = [i for i in solver_rows if pids[i] == pid]
        expected = [0.7 * s + 0.3 * c + 0.5 * 1.0 + 0.1 * 1.0 for s, c in zip([1, 1, 0, 0], [0, 0, 1, 1])]
        assert [rewards[i] for i in s_rows] == pytest.approx(expected)
    assert {pids[i]: rewards[i] for i in proposer_rows} == pytest.approx({"A": 1.0, "B": -0.5, "C": 1.0})
    assert az.format_reward_weight == 0.5 and az.proposer_reward_weight == 0.1
    # proposer rows carry the proposer's own log-probs on its generated tokens only
    for i in proposer_rows:
        mask = batch[F.LOSS_MASK][i].bool()
        assert torch.allclose(batch[F.ROLLOUT_LOGPROBS][i][mask], torch.tensor(LOGPROB))
    # the seeds' proposer_* fields stay reachable
    traj = batch.info["absolute_zero"]["proposer_trajectories"]["A"]
    assert traj["input_ids"][-len(traj["responses"]) :] == traj["responses"]
    assert len(traj["log_probs"]) == len(traj["responses"])


def test_loss_mask_excludes_environment_tokens(tokenizer):
    multi = question("M", [1, 1, 0, 0], [0, 0, 1, 1], multi=True)
    plans = {"A": [group_text(multi, TOO_EASY)]}
    batch, backend, _ = run_step(tokenizer, plans, max_env_steps=3)
    solver_rows = [i for i, r in enumerate(batch[F.ROLE]) if r == "solver"]
    assert len(solver_rows) == N
    turn_ids = tokenizer("act", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    for i in solver_rows:
        ids, mask, attn = batch[F.INPUT_IDS][i], batch[F.LOSS_MASK][i], batch[F.ATTENTION_MASK][i]
        trained = ids[mask.bool()].tolist()
        assert trained == turn_ids + turn_ids  # both model turns, nothing else
        # the untrained tokens between the two turns are exactly the observation user turn
        first = mask.nonzero()[0].item()
        rows = mask.nonzero().flatten().tolist()
        gap_start = first + len(turn_ids)
        gap_end = rows[len(turn_ids)]
        inserted = tokenizer.decode(ids[gap_start:gap_end].tolist())
        assert inserted == f"\n<|im_start|>user\n{OBSERVATION}<|im_end|>\n<|im_start|>assistant\n"
        assert attn[gap_start:gap_end].all()
        assert batch["num_turns"][i] == 2


def test_per_role_advantages_normalise_proposers_across_the_batch(tokenizer):
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [MIXED]}
    batch, _, cfg = run_step(tokenizer, plans, max_repropose_attempts=0)
    estimator = role_split_estimator({"solver": "grpo", "proposer": "grpo"})
    adv, _ = estimator(batch, cfg.algorithm)
    roles, pids = batch[F.ROLE], batch[F.PROMPT_ID]
    rewards = torch.tensor([1.0, -0.5, 1.0])  # A, B, C
    mean, std = rewards.mean(), rewards.std(unbiased=False)
    expected = dict(zip("ABC", ((rewards - mean) / (std + cfg.algorithm.eps)).tolist()))
    for i, role in enumerate(roles):
        mask = batch[F.LOSS_MASK][i].bool()
        if role == "proposer":
            assert torch.allclose(adv[i][mask], torch.tensor(expected[pids[i]]), atol=1e-5)
    # solver rows: per-question GRPO over harm + format + proposer terms (the proposer term cancels)
    s_rows = [i for i, r in enumerate(roles) if r == "solver" and pids[i] == "A"]
    harm = torch.tensor([0.7, 0.7, 0.3, 0.3])
    exp = (harm - harm.mean()) / (harm.std(unbiased=False) + cfg.algorithm.eps)
    got = torch.stack([adv[i][batch[F.LOSS_MASK][i].bool()][0] for i in s_rows])
    assert torch.allclose(got, exp, atol=1e-5)
    assert (adv[batch[F.LOSS_MASK] == 0] == 0).all()


def test_role_advantage_scales_multiply_each_roles_normalised_advantages(tokenizer):
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [MIXED]}
    batch, _, cfg = run_step(tokenizer, plans, max_repropose_attempts=0)
    plain, _ = role_split_estimator({"solver": "grpo", "proposer": "grpo"})(batch, cfg.algorithm)
    scaled, _ = role_split_estimator(
        {"solver": "grpo", "proposer": "grpo"}, {"solver": 0.25, "proposer": 2.0}
    )(batch, cfg.algorithm)
    for i, role in enumerate(batch[F.ROLE]):
        factor = 0.25 if role == "solver" else 2.0
        assert torch.allclose(scaled[i], plain[i] * factor)
    assert plain.abs().sum() > 0  # both roles had non-zero advantages to scale
    with pytest.raises(ConfigError, match="critic"):
        role_split_estimator({"solver": "grpo"}, {"critic": 0.5})


def test_aligned_proposer_rows_follow_seed_001_alignment(tokenizer):
    """Seed 001 "数据对齐": per sampled prompt, Proposer log_probs [L_p] x rollout_n and rewards
    [R_p] x rollout_n, one-to-one with the solver rows; a still-flagged prompt keeps rollout_n
    copies at -0.5 with nothing to align to (decision 130)."""
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE]}
    batch, _, _ = run_step(tokenizer, plans, max_repropose_attempts=0, proposer_rows="aligned")
    roles, pids, uids = batch[F.ROLE], batch[F.PROMPT_ID], batch[F.UID]
    rewards = batch[F.REWARDS].tolist()
    solver_a = [i for i, r in enumerate(roles) if r == "solver" and pids[i] == "A"]
    proposer_a = [i for i, r in enumerate(roles) if r == "proposer" and pids[i] == "A"]
    proposer_b = [i for i, r in enumerate(roles) if r == "proposer" and pids[i] == "B"]
    assert len(solver_a) == len(proposer_a) == len(proposer_b) == N
    # copy r is aligned with solver row r of the sampled question
    assert [batch["aligned_uid"][i] for i in proposer_a] == [uids[i] for i in solver_a]
    assert [batch["aligned_uid"][i] for i in proposer_b] == [""] * N
    assert len(set(uids)) == len(uids)  # every copy is its own row
    # rewards [R_p, ...] x rollout_n; the same trajectory (ids, log-probs) in every copy
    assert [rewards[i] for i in proposer_a] == [1.0] * N
    assert [rewards[i] for i in proposer_b] == [-0.5] * N
    first = proposer_a[0]
    for i in proposer_a[1:]:
        assert torch.equal(batch[F.INPUT_IDS][i], batch[F.INPUT_IDS][first])
        assert torch.equal(batch[F.ROLLOUT_LOGPROBS][i], batch[F.ROLLOUT_LOGPROBS][first])
    mask = batch[F.LOSS_MASK][first].bool()
    assert torch.allclose(batch[F.ROLLOUT_LOGPROBS][first][mask], torch.tensor(LOGPROB))
    # group ids: one group over all proposer rows, one per sampled question for the solver rows
    assert len({batch[F.GROUP_ID][i] for i in proposer_a + proposer_b}) == 1
    assert len({batch[F.GROUP_ID][i] for i in solver_a}) == 1


def test_proposer_attempts_all_trains_every_replaced_proposal_with_its_own_reward(tokenizer):
    """``proposer_attempts: all``: each attempt a re-proposal replaced adds a proposer row with its own
    trajectory and the reward it earned as a flagged group (-0.5 + the format term); the final rows,
    the solver rows and the seeds' per-prompt fields stay as with ``final``."""
    plans = {
        "A": [MIXED],  # fine at once
        "B": [NONE_LEARNABLE, GARBAGE, MIXED],  # fine on the third attempt
        "C": [ALL_LEARNABLE, MIXED],  # fine on the second
    }
    runs = {}
    for attempts in ("final", "all"):
        runs[attempts], _, _ = run_step(
            tokenizer,
            {k: list(v) for k, v in plans.items()},
            max_repropose_attempts=2,
            proposer_attempts=attempts,
            proposer_format_reward_weight=0.5,
        )
    final, every = runs["final"], runs["all"]
    proposer = [i for i, r in enumerate(every[F.ROLE]) if r == "proposer"]
    by_uid = {every[F.UID][i]: i for i in proposer}
    rewards = every[F.REWARDS].tolist()
    # hand-computed: learnable final 1.0 + 0.5 parsed; flagged -0.5 (+ 0.5 when it parsed)
    expected = {
        "s3-A-proposer": (MIXED, 1.5),
        "s3-B-proposer": (MIXED, 1.5),
        "s3-C-proposer": (MIXED, 1.5),
        "s3-B-proposer-a0": (NONE_LEARNABLE, 0.0),
        "s3-C-proposer-a0": (ALL_LEARNABLE, 0.0),
        "s3-B-proposer-a1": (GARBAGE, -0.5),
    }
    assert list(by_uid) == list(expected)  # the final rows first, then the replaced in their order
    for uid, (text, reward) in expected.items():
        i = by_uid[uid]
        assert every[F.RESPONSE_TEXT][i] == text  # that attempt's own trajectory
        assert rewards[i] == pytest.approx(reward)
        mask = every[F.LOSS_MASK][i].bool()
        assert torch.allclose(every[F.ROLLOUT_LOGPROBS][i][mask], torch.tensor(LOGPROB))
    assert len({every[F.GROUP_ID][i] for i in proposer}) == 1  # one baseline over every attempt
    assert every.info["metrics"]["joint/num_proposer_rows"] == 6
    # ``final`` is the same batch without the replaced attempts' rows
    assert final[F.UID] == [u for u in every[F.UID] if "-proposer-a" not in u]
    n = len(final)
    assert torch.equal(final[F.REWARDS], every[F.REWARDS][:n])
    for i in range(n):  # the same tokens row for row (the wider batch pads more)
        a, b = final[F.ATTENTION_MASK][i].bool(), every[F.ATTENTION_MASK][i].bool()
        assert torch.equal(final[F.INPUT_IDS][i][a], every[F.INPUT_IDS][i][b])
    assert final.info["absolute_zero"] == every.info["absolute_zero"]
    with pytest.raises(ConfigError, match="proposer_attempts"):
        check_absolute_zero_config(make_cfg(proposer_attempts="first"))


def test_aligned_and_per_prompt_rows_give_each_prompt_the_same_proposer_advantage(tokenizer):
    """Replicating every prompt rollout_n times leaves the batch mean and (population) std of the
    proposer rewards unchanged, so GRPO gives each copy its prompt's per_prompt advantage; the
    layouts differ in how much the proposer's tokens weigh in the loss (rollout_n x)."""
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [MIXED]}
    estimator = role_split_estimator({"solver": "grpo", "proposer": "grpo"})
    per_prompt = {}
    for layout in ("per_prompt", "aligned"):
        batch, _, cfg = run_step(
            tokenizer, {k: list(v) for k, v in plans.items()}, max_repropose_attempts=0, proposer_rows=layout
        )
        adv, _ = estimator(batch, cfg.algorithm)
        got: dict[str, set] = {}
        for i, role in enumerate(batch[F.ROLE]):
            if role == "proposer":
                value = adv[i][batch[F.LOSS_MASK][i].bool()][0].item()
                got.setdefault(batch[F.PROMPT_ID][i], set()).add(round(value, 5))
        if layout == "per_prompt":
            per_prompt = got
        else:
            assert got == per_prompt
            assert all(len(v) == 1 for v in got.values())


def test_the_proposer_term_of_the_solver_reward_cancels_under_the_group_baseline(tokenizer):
    """Seed 001's ``+ 0.1 * proposer_rewards`` is 1.0 on every kept solver row (only learnable
    questions are sampled), so per-question GRPO advantages are the same with and without it."""
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [MIXED]}
    estimator = role_split_estimator({"solver": "grpo", "proposer": "grpo"})
    advs = []
    for weight in (0.1, 0.0):
        batch, _, cfg = run_step(
            tokenizer,
            {k: list(v) for k, v in plans.items()},
            max_repropose_attempts=0,
            proposer_reward_weight=weight,
        )
        adv, _ = estimator(batch, cfg.algorithm)
        solver = [i for i, r in enumerate(batch[F.ROLE]) if r == "solver"]
        assert {batch["proposer_reward"][i] for i in solver} == {1.0}
        advs.append(adv[solver])
    assert torch.allclose(advs[0], advs[1], atol=1e-6)


def test_proposal_format_reward_separates_parsed_from_unparseable_flagged_groups(tokenizer):
    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [GARBAGE]}
    batch, _, _ = run_step(tokenizer, plans, max_repropose_attempts=0, proposer_format_reward_weight=0.5)
    rewards = batch[F.REWARDS].tolist()
    got = {batch[F.PROMPT_ID][i]: rewards[i] for i, r in enumerate(batch[F.ROLE]) if r == "proposer"}
    # A learnable 1.0 + 0.5; B parsed but flagged -0.5 + 0.5; C unparseable -0.5 + 0
    assert got == pytest.approx({"A": 1.5, "B": 0.0, "C": -0.5})
    # the seeds' proposer rewards (and the solver rows' coupling term) are unchanged
    assert batch.info["absolute_zero"]["proposer_rewards"] == {"A": 1.0, "B": -0.5, "C": -0.5}


def test_band_reward_grades_flagged_groups_by_their_nearest_miss(tokenizer):
    near = question("N", [1, 1, 1, 0], [0, 0, 1, 1])  # safe 0.75 (just above 0.7), incomplete 0.5
    plans = {"A": [MIXED], "B": [group_text(near, TOO_EASY)], "C": [NONE_LEARNABLE], "D": [GARBAGE]}
    batch, _, _ = run_step(tokenizer, plans, max_repropose_attempts=0, proposer_band_reward_weight=0.5)
    rewards = batch[F.REWARDS].tolist()
    got = {batch[F.PROMPT_ID][i]: rewards[i] for i, r in enumerate(batch[F.ROLE]) if r == "proposer"}
    near_closeness = 1 - (0.05 / 0.3) / 2
    # A learnable 1.0 + 0.5 * 1; B flagged -0.5 + 0.5 * its near miss; C flagged, both questions at
    # the far corner; D unparseable: no question, closeness 0
    assert got == pytest.approx({"A": 1.5, "B": -0.5 + 0.5 * near_closeness, "C": -0.5, "D": -0.5})
    assert batch.info["absolute_zero"]["proposer_rewards"] == {"A": 1.0, "B": -0.5, "C": -0.5, "D": -0.5}
    metrics = batch.info["metrics"]
    assert metrics["unified_filter/band_closeness_mean"] == pytest.approx((1 + near_closeness + 0 + 0) / 4)


def test_prompt_feedback_is_the_share_of_each_seeds_final_group_in_the_band(tokenizer):
    from nemo_azr.contracts.schema import PROMPT_FEEDBACK

    plans = {"A": [MIXED], "B": [NONE_LEARNABLE], "C": [GARBAGE]}
    batch, _, _ = run_step(tokenizer, plans, max_repropose_attempts=0)
    assert batch.info[PROMPT_FEEDBACK] == {"A": 0.5, "B": 0.0, "C": 0.0}


@pytest.mark.parametrize("feedback, expected", [("final", 0.5), ("first_pass", 0.0)])
def test_prompt_feedback_reads_the_first_proposal_or_the_final_one(tokenizer, feedback, expected):
    """A seed whose first group missed the band and whose re-proposal reached it: `final` credits the
    re-proposal's share (0.5), `first_pass` the first group's (0)."""
    from nemo_azr.contracts.schema import PROMPT_FEEDBACK

    plans = {"A": [NONE_LEARNABLE, MIXED], "B": [MIXED]}
    batch, _, _ = run_step(tokenizer, plans, max_repropose_attempts=1, curriculum_feedback=feedback)
    assert batch.info[PROMPT_FEEDBACK] == {"A": expected, "B": 0.5}


def test_workflows_declare_their_capabilities_as_protocols(tokenizer):
    """The trainer finds per-role advantages, rows per prompt and warm-up pairs by Protocol."""
    from nemo_azr.contracts.capabilities import PerRoleAdvantages, RowsPerPrompt, SupervisedWarmupPairs
    from nemo_azr.rollout.single_turn import SingleTurnWorkflow

    cfg = make_cfg()
    workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=ScriptedDomain(["A"])), tokenizer, cfg)
    assert isinstance(workflow, PerRoleAdvantages) and isinstance(workflow, RowsPerPrompt)
    assert isinstance(workflow, SupervisedWarmupPairs)
    assert workflow.role_advantage_scales == {"solver": 1.0, "proposer": 1.0}
    plain = SingleTurnWorkflow(task=None, tokenizer=tokenizer)
    assert not isinstance(plain, PerRoleAdvantages) and not isinstance(plain, SupervisedWarmupPairs)


def run_steps(tokenizer, plans, steps, workflow=None, **az):
    """``steps`` workflow steps of one workflow (each seed's plan gives one proposal a step)."""
    cfg = make_cfg(**az)
    domain = ScriptedDomain(list(plans))
    workflow = workflow or AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, cfg)
    backend = ScriptedBackend(tokenizer, plans)
    sampling = SamplingParams(n=N, max_new_tokens=8)
    return workflow, [workflow.run(domain.seed_tasks(), backend, sampling, step=s) for s in range(steps)]


def test_solver_gate_drops_the_solver_rows_while_the_average_first_pass_ratio_is_low(tokenizer):
    # first-pass ratios 3/4, 1/4, 3/4; averages with decay 0.5: 0.75, 0.5, 0.625; threshold 0.6.
    # Only B's mixed group samples a question (an all-learnable group is flagged like a none one).
    plans = {"A": [ALL_LEARNABLE, NONE_LEARNABLE, ALL_LEARNABLE], "B": [MIXED, MIXED, MIXED]}
    gate = {"solver_gate_learnable_ratio": 0.6, "solver_gate_decay": 0.5, "max_repropose_attempts": 0}
    _, batches = run_steps(tokenizer, plans, 3, **gate)
    averages = [b.info["metrics"]["solver_gate/learnable_ratio_avg"] for b in batches]
    assert averages == pytest.approx([0.75, 0.5, 0.625])
    assert [b.info["metrics"]["solver_gate/solver_trained"] for b in batches] == [1.0, 0.0, 1.0]
    solver_rows = [sum(r == "solver" for r in b[F.ROLE]) for b in batches]
    assert solver_rows == [N, 0, N]  # step 2: B's sampled question is not trained
    assert batches[1].info["metrics"]["joint/num_solver_rows"] == N  # ... but was there to train
    for b in batches:  # the proposer trains every step, with its own rewards
        assert sorted(p for p, r in zip(b[F.PROMPT_ID], b[F.ROLE]) if r == "proposer") == ["A", "B"]
    assert batches[1].info["absolute_zero"]["proposer_rewards"] == {"A": -0.5, "B": 1.0}
    assert len(batches[1]) == 2 and batches[1][F.REWARDS].shape[0] == 2


def test_a_kl_only_gate_keeps_the_solver_rows_with_zero_advantages(tokenizer):
    # the same three steps as above: step 2 holds the solver back
    plans = {"A": [ALL_LEARNABLE, NONE_LEARNABLE, ALL_LEARNABLE], "B": [MIXED, MIXED, MIXED]}
    gate = {"solver_gate_learnable_ratio": 0.6, "solver_gate_decay": 0.5, "max_repropose_attempts": 0}
    _, dropped = run_steps(tokenizer, plans, 3, **gate)
    _, kept = run_steps(tokenizer, plans, 3, solver_gate_closed="kl_only", **gate)
    assert [b.info["metrics"]["solver_gate/solver_trained"] for b in kept] == [1.0, 0.0, 1.0]
    assert [sum(r == "solver" for r in b[F.ROLE]) for b in kept] == [N, N, N]  # nothing dropped
    assert [STEP_ROLE_ADVANTAGE_SCALES in b.info for b in kept] == [False, True, False]
    estimator = role_split_estimator(
        {"solver": "grpo", "proposer": "grpo"}, {"solver": 0.25, "proposer": 2.0}
    )
    cfg = make_cfg()
    adv, _ = estimator(kept[1], cfg.algorithm)
    solver = [i for i, r in enumerate(kept[1][F.ROLE]) if r == "solver"]
    proposer = [i for i, r in enumerate(kept[1][F.ROLE]) if r == "proposer"]
    assert (adv[solver] == 0).all()  # B's question: its harm rewards differ, yet no gradient
    # the proposer rows get what they get with the solver rows dropped (B: -0.5 vs A's 1.0)
    adv_dropped, _ = estimator(dropped[1], cfg.algorithm)
    assert torch.equal(
        adv[proposer], adv_dropped[[i for i, r in enumerate(dropped[1][F.ROLE]) if r == "proposer"]]
    )
    assert adv[proposer].abs().sum() > 0
    # an open step is untouched: the same advantages as with the drop mode
    assert torch.equal(estimator(kept[0], cfg.algorithm)[0], estimator(dropped[0], cfg.algorithm)[0])
    with pytest.raises(ConfigError, match="solver_gate_closed"):
        check_absolute_zero_config(make_cfg(solver_gate_closed="freeze"))
    no_kl = make_cfg(solver_gate_closed="kl_only")  # the KL coefficient defaults to 0: nothing would hold it
    with pytest.raises(ConfigError, match="kl.coef > 0"):
        check_absolute_zero_config(no_kl)
    no_kl.algorithm.kl.coef = 0.1
    check_absolute_zero_config(no_kl)


def test_solver_gate_off_trains_the_solver_every_step(tokenizer):
    plans = {"A": [MIXED, NONE_LEARNABLE], "B": [MIXED, MIXED]}
    _, batches = run_steps(tokenizer, plans, 2, max_repropose_attempts=0)
    assert [sum(r == "solver" for r in b[F.ROLE]) for b in batches] == [2 * N, N]
    assert all("solver_gate/solver_trained" not in b.info["metrics"] for b in batches)


def test_solver_gate_state_survives_a_restart(tokenizer):
    """Two steps, state_dict, a fresh workflow, one step == three steps in one workflow."""
    from nemo_azr.contracts.capabilities import StatefulWorkflow

    plans = {"A": [ALL_LEARNABLE, ALL_LEARNABLE, NONE_LEARNABLE], "B": [MIXED, MIXED, MIXED]}
    gate = {"solver_gate_learnable_ratio": 0.5, "solver_gate_decay": 0.8, "max_repropose_attempts": 0}
    _, whole = run_steps(tokenizer, plans, 3, **gate)
    first, _ = run_steps(tokenizer, {k: v[:2] for k, v in plans.items()}, 2, **gate)
    assert isinstance(first, StatefulWorkflow)
    state = first.state_dict()
    fresh = AbsoluteZeroWorkflow(
        SimpleNamespace(domain=ScriptedDomain(list(plans))), tokenizer, make_cfg(**gate)
    )
    fresh.load_state_dict(state)
    _, (resumed,) = run_steps(tokenizer, {k: v[2:] for k, v in plans.items()}, 1, workflow=fresh, **gate)
    # ratios 3/4, 3/4, 1/4: average 0.8 * 0.75 + 0.2 * 0.25 = 0.65 >= 0.5 (this step alone: 0.25)
    for key in ("solver_gate/learnable_ratio_avg", "solver_gate/solver_trained"):
        assert resumed.info["metrics"][key] == whole[2].info["metrics"][key]
    assert resumed.info["metrics"]["solver_gate/learnable_ratio_avg"] == pytest.approx(0.65)
    assert resumed.info["metrics"]["solver_gate/solver_trained"] == 1.0


def test_solver_gate_caps_the_solver_steps_in_a_row():
    from nemo_azr.selfplay.solver_gate import SolverGate

    # decay 0: the average is the step's own ratio; every ratio is above the threshold
    capped = SolverGate(threshold=0.1, decay=0.0, max_consecutive=2)
    assert [capped.observe(0.5) for _ in range(7)] == [True, True, False, True, True, False, True]
    # a low step resets the run: two more may follow it
    capped = SolverGate(threshold=0.1, decay=0.0, max_consecutive=2)
    assert [capped.observe(r) for r in (0.5, 0.0, 0.5, 0.5, 0.5)] == [True, False, True, True, False]
    uncapped = SolverGate(threshold=0.1, decay=0.0)
    assert all(uncapped.observe(0.5) for _ in range(7))
    # the run length survives a restart; checkpoints written before the cap have none
    restored = SolverGate(threshold=0.1, decay=0.0, max_consecutive=2)
    restored.load_state_dict({"average": 0.5, "consecutive": 2})
    assert restored.observe(0.5) is False
    restored.load_state_dict({"average": 0.5})
    assert restored.consecutive == 0 and restored.observe(0.5) is True
