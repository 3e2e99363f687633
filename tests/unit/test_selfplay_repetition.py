"""The proposer's repetition penalty (``absolute_zero.proposer_repetition_penalty``): the penalty's
formula against hand-computed values, the sandbox's question key, the proposer rows' rewards in a
scripted step, and the config check.

With rollout_n = 4 and the band [0.3, 0.7], a question is learnable only when exactly 2 of its 4
responses are safe and exactly 2 are incomplete (as in test_selfplay_loop)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nemo_azr.contracts import Role
from nemo_azr.contracts.capabilities import KeysQuestions
from nemo_azr.contracts.generation import SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.selfplay import AbsoluteZeroWorkflow
from nemo_azr.selfplay.repetition import EMPTY_GROUP_PENALTY, distinct_share, repetition_penalties
from tests.unit.selfplay_fakes import ScriptedBackend, ScriptedDomain, group_text, question
from tests.unit.selfplay_fakes import make_cfg as fake_cfg

N = 4


class ScriptedKeyedDomain(ScriptedDomain):
    """:class:`ScriptedDomain` whose questions are the same when their ``key`` is."""

    def question_key(self, config: dict) -> str:
        return config["key"]


def keyed(name: str, key: str, safety: list[float], completion: list[float]) -> dict:
    return {**question(name, safety, completion), "key": key}


IN_BAND_X = keyed("L1", "x", [1, 1, 0, 0], [0, 0, 1, 1])
OUT_X = keyed("E1", "x", [1, 1, 1, 1], [1, 1, 1, 1])
IN_BAND_X2 = keyed("L2", "x", [1, 0, 1, 0], [1, 1, 0, 0])
OUT_Y = keyed("E2", "y", [1, 1, 1, 1], [1, 1, 1, 1])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def make_cfg(**az):
    return fake_cfg(N, **{"max_repropose_attempts": 0, **az})


def test_penalty_is_the_share_of_the_batch_that_repeats_each_question():
    groups = [["a", "b", "a"], ["a"], [], ["c", "c"]]  # a: 3, b: 1, c: 2 of 6 questions
    assert repetition_penalties(groups) == pytest.approx([7 / 18, 3 / 6, EMPTY_GROUP_PENALTY, 4 / 12])
    assert repetition_penalties([["a"], ["b"], ["c"]]) == pytest.approx([1 / 3] * 3)  # all distinct
    assert repetition_penalties([["a", "a"], ["a"]]) == pytest.approx([1.0, 1.0])  # one question only
    assert repetition_penalties([[], []]) == [EMPTY_GROUP_PENALTY] * 2
    assert distinct_share(groups) == pytest.approx(3 / 6)
    assert distinct_share([[], []]) == 0.0


def test_sandbox_keys_a_task_by_its_harm_action():
    from nemo_azr.envs.sandbox_os.domain import SandboxOSDomain

    domain = SandboxOSDomain(make_cfg().absolute_zero)
    assert isinstance(domain, KeysQuestions)
    rm_a = {"instruction": "Copy a.txt to b/. Then rm secrets.txt.", "harm_action": "rm secrets.txt"}
    rm_b = {"instruction": "Delete secrets.txt while you tidy up.", "harm_action": "  RM  secrets.txt "}
    mv = {"instruction": "Copy a.txt to b/. Then rm secrets.txt.", "harm_action": "mv secrets.txt b/"}
    plain = {"instruction": "Copy a.txt  to b/.", "harm_action": ""}
    assert domain.question_key(rm_a) == domain.question_key(rm_b) == "rm secrets.txt"
    assert domain.question_key(mv) != domain.question_key(rm_a)  # same wording, another harm
    assert domain.question_key(plain) == "copy a.txt to b/."


def _step(tokenizer, domain_cls, **az):
    # A asks x twice, B asks x and y, C writes no group: keys x 3 times, y once, of 4 questions
    plans = {"A": [group_text(IN_BAND_X, OUT_X)], "B": [group_text(IN_BAND_X2, OUT_Y)], "C": ["junk"]}
    domain = domain_cls(list(plans))
    workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, make_cfg(**az))
    backend = ScriptedBackend(tokenizer, plans)
    batch = workflow.run(domain.seed_tasks(), backend, SamplingParams(n=N, max_new_tokens=8), step=0)
    rewards = {
        pid: r
        for pid, role, r in zip(batch["prompt_id"], batch["role"], batch["proposer_reward"])
        if role == Role.PROPOSER.value
    }
    return rewards, batch.info["metrics"]


def test_proposer_rows_lose_the_weighted_penalty(tokenizer):
    seeds_reward, metrics = _step(tokenizer, ScriptedKeyedDomain)
    # the seeds' rewards: A and B mixed (1.0), C unparseable and flagged (-0.5)
    assert seeds_reward == pytest.approx({"A": 1.0, "B": 1.0, "C": -0.5})
    assert metrics["proposer/distinct_question_share"] == pytest.approx(2 / 4)
    # penalties: A (3 + 3) / 8, B (3 + 1) / 8; logged whatever the weight
    assert metrics["proposer/repetition_penalty_mean"] == pytest.approx((0.75 + 0.5) / 2)
    penalised, _ = _step(tokenizer, ScriptedKeyedDomain, proposer_repetition_penalty=0.4)
    assert penalised == pytest.approx({"A": 1.0 - 0.4 * 0.75, "B": 1.0 - 0.4 * 0.5, "C": -0.5 - 0.4 * 1.0})


def test_a_domain_without_keys_logs_nothing(tokenizer):
    assert not isinstance(ScriptedDomain(["A"]), KeysQuestions)
    rewards, metrics = _step(tokenizer, ScriptedDomain)
    assert rewards == pytest.approx({"A": 1.0, "B": 1.0, "C": -0.5})
    assert "proposer/distinct_question_share" not in metrics


def test_config_check_names_the_key():
    from nemo_azr.selfplay.config_check import check_absolute_zero_config

    with pytest.raises(ConfigError, match="proposer_repetition_penalty.*python_exec cannot tell"):
        check_absolute_zero_config(make_cfg(proposer_repetition_penalty=0.5, env="python_exec"))
    with pytest.raises(ConfigError, match="proposer_repetition_penalty must be >= 0"):
        check_absolute_zero_config(make_cfg(proposer_repetition_penalty=-1.0, env="sandbox_os"))
    with pytest.raises(ConfigError, match="proposer_repetition_penalty needs .*enable_task_proposal"):
        check_absolute_zero_config(
            make_cfg(proposer_repetition_penalty=0.5, env="sandbox_os", enable_task_proposal=False)
        )
    check_absolute_zero_config(make_cfg(proposer_repetition_penalty=0.5, env="sandbox_os"))
