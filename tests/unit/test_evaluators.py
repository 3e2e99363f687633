"""Rule / LLM evaluator combinations, and the OSWorld desktop_env adapter (against a fake package).

The desktop_env tests live here because the adapter's EvalResult feeds ``score_episodes``; they
never start a VM: ``desktop_env.desktop_env`` is a fake module put into ``sys.modules``.
"""

import pytest

from nemo_azr.contracts.env import EvalResult
from nemo_azr.errors import ConfigError, RewardError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rewards.evaluators import score_episodes
from nemo_azr.rewards.judge import LLMJudge
from tests.unit.judge_fakes import ScriptedBackend, evaluator_cfg


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


RESULTS = [
    EvalResult(safety_score=1.0, completion_score=0.0, format_score=1.0),
    EvalResult(safety_score=0.0, completion_score=1.0, format_score=0.5),
    EvalResult(safety_score=1.0, completion_score=0.5, format_score=0.0),
]
HISTORIES = [
    [{"role": "user", "content": f"task {i}"}, {"role": "assistant", "content": "ok"}] for i in range(3)
]


def test_rule_rule_needs_no_judge():
    out = score_episodes(RESULTS, HISTORIES, evaluator_cfg("rule", "rule"), None)
    assert out.safety == [1.0, 0.0, 1.0]
    assert out.completion == [0.0, 1.0, 0.5]
    assert out.format == [1.0, 0.5, 0.0]
    assert out.metrics["judge/calls"] == 0 and out.metrics["judge/parse_failure_rate"] == 0.0


def test_llm_safety_rule_completion(tok):
    backend = ScriptedBackend(["Score: 0.2", "blah", "9/10"])
    judge = LLMJudge(backend, tok, evaluator_cfg("llm", "rule").judge)
    out = score_episodes(RESULTS, HISTORIES, evaluator_cfg("llm", "rule"), judge)
    assert out.safety == pytest.approx([0.2, 0.5, 0.9])  # "blah" -> the default 0.5
    assert out.completion == [0.0, 1.0, 0.5]
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 3
    assert all("SAFETY RUBRIC" in tok.decode(r.prompt_ids) for r in backend.calls[0][0])
    assert out.metrics["judge/calls"] == 3 and out.metrics["judge/parse_failures"] == 1
    assert out.metrics["judge/parse_failure_rate"] == pytest.approx(1 / 3)
    assert (
        out.metrics["judge/safety_parse_failures"] == 1
        and out.metrics["judge/completion_parse_failures"] == 0
    )


def test_both_llm_share_one_generate_call(tok):
    replies = ["1", "0", "0.5", "Score: 0.3", "x", "100%"]  # 3 safety, then 3 completion
    backend = ScriptedBackend(replies)
    judge = LLMJudge(backend, tok, evaluator_cfg("llm", "llm").judge)
    out = score_episodes(RESULTS, HISTORIES, evaluator_cfg("llm", "llm"), judge)
    assert out.safety == pytest.approx([1.0, 0.0, 0.5])
    assert out.completion == pytest.approx([0.3, 0.5, 1.0])
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 6
    prompts = [tok.decode(r.prompt_ids) for r in backend.calls[0][0]]
    assert all("SAFETY RUBRIC" in p for p in prompts[:3]) and all(
        "COMPLETION RUBRIC" in p for p in prompts[3:]
    )
    assert "task 2" in prompts[2] and "task 0" in prompts[3]  # episode order within each dimension
    assert out.metrics["judge/calls"] == 6 and out.metrics["judge/parse_failures"] == 1
    assert out.metrics["judge/completion_parse_failures"] == 1
    assert judge.num_calls == 6 and judge.num_parse_failures == 1


def test_rule_fallback_replaces_only_unparsed_replies_and_counts_them(tok):
    cfg = evaluator_cfg("llm", "rule")
    cfg.judge.on_parse_failure = "rule"
    backend = ScriptedBackend(["Score: 0.2", "blah", "no score"])
    out = score_episodes(RESULTS, HISTORIES, cfg, LLMJudge(backend, tok, cfg.judge))
    # episode 0 keeps the judge's 0.2; episodes 1 and 2 take the rule's safety (0.0, 1.0), not 0.5
    assert out.safety == pytest.approx([0.2, 0.0, 1.0])
    assert out.metrics["judge/parse_failures"] == 2 and out.metrics["judge/rule_fallbacks"] == 2
    cfg.judge.on_parse_failure = "default"
    out = score_episodes(
        RESULTS, HISTORIES, cfg, LLMJudge(ScriptedBackend(["Score: 0.2", "blah", "x"]), tok, cfg.judge)
    )
    assert out.safety == pytest.approx([0.2, 0.5, 0.5]) and out.metrics["judge/rule_fallbacks"] == 0


def test_rule_without_env_rule_is_a_config_error():
    results = [EvalResult(safety_score=None, completion_score=1.0, format_score=1.0)]
    with pytest.raises(
        ConfigError,
        match=r"absolute_zero.safety_evaluator_type=rule but env 'desktop_env' has no rule for safety.*use llm",
    ):
        score_episodes(results, HISTORIES[:1], evaluator_cfg("rule", "rule", env="desktop_env"), None)


def test_bad_configs():
    with pytest.raises(ConfigError, match="completion_evaluator_type must be one of"):
        score_episodes(RESULTS, HISTORIES, evaluator_cfg("rule", "llama"), None)
    with pytest.raises(ConfigError, match="safety_evaluator_type=llm needs an LLM judge"):
        score_episodes(RESULTS, HISTORIES, evaluator_cfg("llm", "rule"), None)
    with pytest.raises(ValueError, match="3 eval results but 2 histories"):
        score_episodes(RESULTS, HISTORIES[:2], evaluator_cfg("rule", "rule"), None)
    nan = [EvalResult(safety_score=float("nan"), completion_score=1.0, format_score=1.0)]
    with pytest.raises(RewardError, match="safety_score of episode 0"):
        score_episodes(nan, HISTORIES[:1], evaluator_cfg("rule", "rule"), None)
