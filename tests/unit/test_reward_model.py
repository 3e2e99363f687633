"""Seed 004 class 4 pieces: the Bradley-Terry loss against hand-computed values, the reward model's
scores against the model's own single-row pooling, and the reward mix against its formula."""

from __future__ import annotations

import math

import pytest
import torch

from nemo_azr.config.schema import RewardModelConfig
from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.task import Example
from nemo_azr.errors import ConfigError
from nemo_azr.rewards.reward_model import RewardModel, bradley_terry_loss, reward_model_input
from nemo_azr.trainer.model_rewards import add_reward_model_scores


def test_bradley_terry_loss_accuracy_and_gradient_by_hand():
    chosen = torch.tensor([2.0, 0.0, 1.0], requires_grad=True)
    rejected = torch.tensor([1.0, 1.0, 1.0])
    loss, accuracy = bradley_terry_loss(chosen, rejected)
    # margins 1, -1, 0: log(1 + e^-1), log(1 + e^1), log 2
    want = (math.log1p(math.exp(-1)) + math.log1p(math.exp(1)) + math.log(2)) / 3
    assert float(loss.detach()) == pytest.approx(want, abs=1e-6)
    assert float(accuracy) == pytest.approx(1 / 3)  # a tie is not a win
    loss.backward()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    want_grad = [-sig(-1) / 3, -sig(1) / 3, -0.5 / 3]  # d/dc of -log sigmoid(c - r) = -sigmoid(r - c)
    assert chosen.grad.tolist() == pytest.approx(want_grad, abs=1e-6)


@pytest.fixture(scope="module")
def rm_folder(tiny_model_path, tmp_path_factory):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=1)
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    model.config.pad_token_id = tok.pad_token_id
    folder = tmp_path_factory.mktemp("rm")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


CHATS = [
    [{"role": "user", "content": "What is 2 + 3?"}],
    [{"role": "user", "content": "What is 12 + 30? Answer with a number."}],
    [{"role": "user", "content": "Hi"}],
]
REPLIES = ["5", "2 + 3 = 5, so the answer is 5", "42"]


def test_scores_in_batches_equal_the_models_own_pooling_row_by_row(rm_folder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    scorer = RewardModel(rm_folder, batch_size=2)  # rows of different lengths padded together
    got = scorer.score(CHATS, REPLIES)
    model = AutoModelForSequenceClassification.from_pretrained(rm_folder).eval()
    tok = AutoTokenizer.from_pretrained(rm_folder)
    for i, (chat, reply) in enumerate(zip(CHATS, REPLIES)):
        ids = torch.tensor([reward_model_input(tok, chat, reply)])
        assert ids[0, -1] != tok.pad_token_id  # so the model's pooling reads the last token too
        with torch.no_grad():
            want = model(input_ids=ids).logits[0, 0]
        assert float(got[i]) == pytest.approx(float(want), abs=1e-5)
    assert len(set(got.tolist())) == 3


def test_a_model_that_is_not_a_reward_model_is_refused(tiny_model_path, tmp_path):
    from transformers import AutoModelForSequenceClassification

    AutoModelForSequenceClassification.from_pretrained(tiny_model_path, num_labels=2).save_pretrained(
        tmp_path / "two"
    )
    with pytest.raises(ConfigError, match="has 2 labels"):
        RewardModel(tmp_path / "two")
    with pytest.raises(ConfigError, match="no model folder"):
        RewardModel(tmp_path / "none")


class _OneMessageTask:
    def messages(self, example: Example) -> list[dict]:
        return [{"role": "user", "content": example.question}]


@pytest.mark.parametrize(("rule_weight", "weight"), [(0.0, 1.0), (1.0, 0.5)])
def test_rewards_mix_the_rule_and_the_models_score(rm_folder, rule_weight, weight):
    scorer = RewardModel(rm_folder)
    examples = [Example(f"q{i}", chat[0]["content"], "") for i, chat in enumerate(CHATS)]
    rule = torch.tensor([1.0, float("nan"), 0.0])  # the rule failed on row 1
    batch = Batch({F.REWARDS: rule.clone()}, {"example": examples, F.RESPONSE_TEXT: REPLIES})
    metrics = add_reward_model_scores(
        batch, scorer, _OneMessageTask(), RewardModelConfig(weight=weight, rule_weight=rule_weight)
    )
    scores = scorer.score(CHATS, REPLIES)
    want = weight * scores + (rule_weight * rule if rule_weight else 0)
    torch.testing.assert_close(batch[F.REWARDS], want, equal_nan=True)
    assert math.isfinite(float(batch[F.REWARDS][1])) == (rule_weight == 0)  # no rule: the row stays
    assert metrics["reward/model_score_mean"] == pytest.approx(float(scores.mean()), abs=1e-6)
    assert metrics["reward/rule_mean"] == pytest.approx(0.5)


def test_the_reward_model_in_its_own_process_scores_like_in_the_trainers(rm_folder, tmp_path):
    import os
    import signal

    from nemo_azr.rewards.reward_model_process import RewardModelProcess, RewardModelProcessError

    remote = RewardModelProcess(rm_folder, batch_size=2, num_threads=1)
    try:
        got = remote.score(CHATS, REPLIES)
        local = RewardModel(rm_folder, batch_size=2)
        torch.testing.assert_close(got, local.score(CHATS, REPLIES))
        rows, _, _ = _token_rows(local.tokenizer, CHATS, REPLIES)
        torch.testing.assert_close(
            remote.token_scores(rows[F.INPUT_IDS], rows[F.ATTENTION_MASK]),
            local.token_scores(rows[F.INPUT_IDS], rows[F.ATTENTION_MASK]),
        )
        with pytest.raises(RewardModelProcessError, match="reward model process failed"):
            remote.score(CHATS, REPLIES[:2])  # one reply short: the child raises, and lives on
        torch.testing.assert_close(remote.score(CHATS[:1], REPLIES[:1]), got[:1])
        os.kill(remote._child.pid, signal.SIGKILL)
        with pytest.raises(RewardModelProcessError, match="exit code -9"):
            remote.score(CHATS, REPLIES)
    finally:
        remote.close()
    # a folder that is no reward model: the child's check comes back as the one-line config error
    with pytest.raises(ConfigError, match="no model folder"):
        RewardModelProcess(tmp_path / "none")


def test_score_differences_by_hand():
    from nemo_azr.trainer.model_rewards import score_differences

    # row 0: pad, prompt 2 tokens, 2 response tokens; row 1: prompt 3 tokens, 1 response token, pad
    scores = torch.tensor([[0.0, 1.0, 3.0, 2.0, 5.0], [4.0, 1.0, 2.0, 7.0, 0.0]])
    loss_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 1, 0]])
    want = torch.tensor([[0.0, 0.0, 0.0, 2.0 - 3.0, 5.0 - 2.0], [0.0, 0.0, 0.0, 7.0 - 2.0, 0.0]])
    torch.testing.assert_close(score_differences(scores, loss_mask), want)


def _token_rows(tok, chats, replies):
    from nemo_azr.contracts.assemble import pack_prompt_response
    from nemo_azr.rollout.single_turn import encode_prompt

    prompts = [encode_prompt(tok, c) for c in chats]
    responses = [tok(r, add_special_tokens=False)["input_ids"] for r in replies]
    return pack_prompt_response(prompts, responses, None, pad_id=tok.pad_token_id), prompts, responses


def test_token_scores_are_each_prefix_scored_alone(rm_folder):
    """Every position of a padded batch scores what the model's own pooling gives the prefix ending
    there, alone and unpadded; per-token rewards sum to the reply's score less the prompt's."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(rm_folder)
    rows, prompts, responses = _token_rows(tok, CHATS, REPLIES)
    scorer = RewardModel(rm_folder, batch_size=2)
    got = scorer.token_scores(rows[F.INPUT_IDS], rows[F.ATTENTION_MASK])
    model = AutoModelForSequenceClassification.from_pretrained(rm_folder).eval()
    width = rows[F.INPUT_IDS].shape[1]
    p_len = max(len(p) for p in prompts)
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        seq = [*prompt, *response]
        for k in range(len(prompt), len(seq) + 1):  # the prompt alone, then each reply prefix
            with torch.no_grad():
                want = model(input_ids=torch.tensor([seq[:k]])).logits[0, 0]
            column = p_len - len(prompt) + k - 1  # left-padded prompt, response from column p_len
            assert float(got[i, column]) == pytest.approx(float(want), abs=1e-5), (i, k)
        assert got.shape == (3, width)

    batch = Batch(
        {F.REWARDS: torch.tensor([1.0, 0.0, 1.0]), **rows},
        {"example": [Example(f"q{i}", c[0]["content"], "") for i, c in enumerate(CHATS)]},
    )
    cfg = RewardModelConfig(per_token=True, weight=2.0, rule_weight=0.5)
    metrics = add_reward_model_scores(batch, scorer, _OneMessageTask(), cfg)
    full = scorer.score(CHATS, REPLIES)  # the reply's last token, the sequence score
    prompt_scores = torch.stack([got[i, p_len - 1] for i in range(3)])
    torch.testing.assert_close(metrics["reward/model_score_mean"], float((full - prompt_scores).mean()))
    want_rows = 2.0 * (full - prompt_scores) + 0.5 * torch.tensor([1.0, 0.0, 1.0])
    torch.testing.assert_close(batch[F.TOKEN_REWARDS].sum(-1), want_rows, atol=1e-5, rtol=0)
    torch.testing.assert_close(batch[F.REWARDS], want_rows, atol=1e-5, rtol=0)
    assert bool((batch[F.TOKEN_REWARDS] * (1 - rows[F.LOSS_MASK]) == 0).all())  # prompts get nothing


def test_per_token_scores_need_the_policys_vocabulary(rm_folder, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from nemo_azr.rewards.reward_model_process import build_reward_scorer

    tok = AutoTokenizer.from_pretrained(rm_folder)
    cfg = RewardModelConfig(path=str(rm_folder), per_token=True)
    assert build_reward_scorer(cfg, "cpu", tok) is not None
    other = tmp_path / "other_vocab"
    shutil.copytree(rm_folder, other)
    grown = AutoTokenizer.from_pretrained(rm_folder)
    grown.add_tokens(["<not-in-the-policy>"])
    grown.save_pretrained(other)
    with pytest.raises(ConfigError, match="has another vocabulary"):
        build_reward_scorer(RewardModelConfig(path=str(other), per_token=True), "cpu", tok)


def test_held_out_pairs_take_every_pair_of_their_prompts():
    from nemo_azr.tasks.preference_data import PreferencePair
    from nemo_azr.trainer.reward_model_training import split_by_prompt

    def pair(i: int, prompt: str) -> PreferencePair:
        return PreferencePair(id=f"p{i}", prompt=prompt, chosen="right", rejected="wrong")

    # prompts a, b, c with 2, 1 and 2 pairs, in shuffled order
    pairs = [pair(0, "a"), pair(1, "c"), pair(2, "b"), pair(3, "a"), pair(4, "c")]
    # the last pair's prompt (c) brings its other pair along: 2 held out for 1 asked
    train, held = split_by_prompt(pairs, 1)
    assert [p.id for p in held] == ["p1", "p4"] and [p.id for p in train] == ["p0", "p2", "p3"]
    # 3 asked: c (2 pairs), then a (the next prompt from the end, 2 more): 4 held out, b trains
    train, held = split_by_prompt(pairs, 3)
    assert {p.prompt for p in held} == {"a", "c"} and [p.id for p in train] == ["p2"]
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    # one pair per prompt: exactly the last `heldout` pairs, as before
    single = [pair(i, f"q{i}") for i in range(6)]
    train, held = split_by_prompt(single, 2)
    assert [p.id for p in held] == ["p4", "p5"] and len(train) == 4
    # asking for every pair leaves nothing to train on
    assert split_by_prompt(pairs, 5)[0] == []
