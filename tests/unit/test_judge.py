"""The LLM judge: score parsing, one batched greedy call, budgeted prompts, failure counting, loading."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_azr.config.schema import JudgeConfig
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rewards.judge import (
    TRUNCATION_MARKER,
    LLMJudge,
    build_judge,
    parse_judge_score,
    render_transcript,
)
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.rollout.single_turn import encode_prompt
from tests.unit.judge_fakes import ScriptedBackend


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Score: 0.8", 0.8),
        ("score=1", 1.0),
        ("0.75", 0.75),
        ("8/10", 0.8),
        ("80%", 0.8),
        ("Score: 0", 0.0),
        ("Score: 1", 1.0),
        ("score of .9", 0.9),
        ("**Score:** 7/10", 0.7),
        ("The final score is 25%", 0.25),
        ("8 out of 10", 0.8),
        ("I counted 3 steps, so 0.4", 0.4),  # no "score": the last number
        ("Score: 0.9, though 2 steps were risky", 0.9),  # the number after "score" wins
        ("score: 0.2 ... revised Score: 0.6", 0.6),  # the last "score" value
        ("Score: 1.", 1.0),
        ("Score: 1.01", None),  # out of range: not clamped
        ("Score: 8", None),
        ("Score: -0.2", None),
        ("120%", None),
        ("11/10", None),
        ("0/0", None),
        ("Score: <number between 0 and 1>", None),  # echoed format line
        ("no digits here", None),
        ("", None),
        ("version v1.2", None),  # digits inside a word are not numbers
    ],
)
def test_parse_judge_score(text, expected):
    got = parse_judge_score(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def _history(n_turns, words=3):
    msgs = []
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"observation {i} " + "word " * words})
        msgs.append({"role": "assistant", "content": f"action {i}"})
    return msgs


def test_scores_counts_and_one_greedy_call(tok):
    cfg = JudgeConfig(max_new_tokens=7, default_score=0.25)
    backend = ScriptedBackend(["Score: 0.9", "I refuse to grade", "7/10"])
    judge = LLMJudge(backend, tok, cfg)
    histories = [_history(1), _history(2), _history(1)]
    out = judge.score_many(histories, "Rate safety.")

    assert out.scores == pytest.approx([0.9, 0.25, 0.7])
    assert out.parsed == [True, False, True]
    assert out.replies == ["Score: 0.9", "I refuse to grade", "7/10"]
    assert (judge.num_calls, judge.num_parse_failures, judge.num_generate_calls) == (3, 1, 1)
    assert len(backend.calls) == 1
    requests, sampling = backend.calls[0]
    assert len(requests) == 3
    assert sampling.greedy and sampling.n == 1 and sampling.max_new_tokens == 7
    # A short transcript is not cut: the prompt is exactly the chat template of rubric + transcript.
    expected = encode_prompt(
        tok,
        [
            {"role": "system", "content": "Rate safety."},
            {"role": "user", "content": render_transcript(histories[1])},
        ],
    )
    assert requests[1].prompt_ids == expected

    backend.texts = ["nope"]
    judge.score_many([_history(1)], "Rate safety.")
    assert (judge.num_calls, judge.num_parse_failures, judge.num_generate_calls) == (4, 2, 2)


def test_per_item_rubrics_and_empty_input(tok):
    backend = ScriptedBackend(["1", "0"])
    judge = LLMJudge(backend, tok, JudgeConfig())
    out = judge.score_many([_history(1), _history(1)], ["Rubric A.", "Rubric B."])
    assert out.scores == [1.0, 0.0]
    texts = [tok.decode(r.prompt_ids) for r in backend.calls[0][0]]
    assert "Rubric A." in texts[0] and "Rubric B." in texts[1]
    assert judge.score_many([], "x").scores == [] and len(backend.calls) == 1  # no call for nothing
    with pytest.raises(ValueError, match="2 rubrics for 1 histories"):
        judge.score_many([_history(1)], ["a", "b"])


def test_render_transcript_is_compact():
    history = [{"role": "user", "content": "  do it\n\n\nnow "}, {"role": "assistant", "content": "ok"}]
    assert render_transcript(history) == "user: do it\nnow\nassistant: ok"


def test_long_transcript_is_cut_from_the_front(tok):
    backend = ScriptedBackend(["Score: 1"] * 2)
    judge = LLMJudge(backend, tok, JudgeConfig(), max_prompt_tokens=80)
    long_history = _history(60, words=10)
    long_history[-1]["content"] = "the very last action"
    judge.score_many([long_history, _history(1)], "Rate it.")
    long_ids, short_ids = (r.prompt_ids for r in backend.calls[0][0])
    full = encode_prompt(
        tok,
        [
            {"role": "system", "content": "Rate it."},
            {"role": "user", "content": render_transcript(long_history)},
        ],
    )
    assert len(full) > 80 and len(long_ids) <= 80
    assert len(long_ids) >= 60  # the cut keeps close to the budget, not just the rubric
    text = tok.decode(long_ids)
    assert "Rate it." in text and TRUNCATION_MARKER in text
    assert "the very last action" in text and "observation 0 " not in text
    assert len(short_ids) <= 80 and TRUNCATION_MARKER not in tok.decode(short_ids)


def test_budget_too_small_for_the_rubric(tok):
    judge = LLMJudge(ScriptedBackend(["1"]), tok, JudgeConfig(), max_prompt_tokens=8)
    with pytest.raises(ConfigError, match="rubric alone does not fit"):
        judge.score_many([_history(3)], "A rubric that is much longer than eight tokens, surely.")


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_path, tok):
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path))
    return HFGenerationBackend(model, tok)


def test_real_tiny_model_end_to_end(tiny_backend, tok):
    cfg = JudgeConfig(max_new_tokens=6, default_score=0.5)
    judge = LLMJudge(tiny_backend, tok, cfg)
    histories = [_history(1), _history(40, words=10)]  # the second is cut to the 384-token budget
    first = judge.score_many(histories, cfg.safety_rubric)
    again = judge.score_many(histories, cfg.safety_rubric)
    assert first.replies == again.replies  # greedy: deterministic
    assert all(0.0 <= s <= 1.0 for s in first.scores)
    for score, ok, reply in zip(first.scores, first.parsed, first.replies):
        assert ok == (parse_judge_score(reply) is not None)
        assert score == (parse_judge_score(reply) if ok else 0.5)
    assert judge.num_calls == 4 and judge.num_generate_calls == 2
    assert judge.num_parse_failures == 2 * first.num_failures
    assert first.num_failures >= 1  # the seeded random tiny model does not write scores


def test_budget_must_fit_the_model_context(tiny_backend, tok):
    with pytest.raises(ConfigError, match="exceeds the judge model's 512 positions"):
        LLMJudge(tiny_backend, tok, JudgeConfig(max_new_tokens=16), max_prompt_tokens=500)


def test_build_judge_with_the_policy_backend(tok):
    backend = ScriptedBackend(["Score: 1"])
    judge = build_judge(JudgeConfig(model_path=""), policy_backend=backend, tokenizer=tok, device="cpu")
    assert judge.backend is backend and judge.tokenizer is tok
    with pytest.raises(ConfigError, match="no policy backend"):
        build_judge(JudgeConfig(model_path=""), policy_backend=None, tokenizer=tok)


def test_build_judge_loads_a_separate_model(tiny_model_path, tok):
    policy_backend = ScriptedBackend(["unused"])
    judge = build_judge(
        JudgeConfig(model_path=str(tiny_model_path), max_new_tokens=4),
        policy_backend=policy_backend,
        tokenizer=None,
        device="cpu",
        max_prompt_tokens=128,
    )
    assert isinstance(judge.backend, HFGenerationBackend) and judge.backend is not policy_backend
    assert judge.tokenizer is not None and judge.tokenizer.encode("hello") == tok.encode("hello")
    model = judge.backend.model
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert next(model.parameters()).dtype == torch.float32  # "auto": the checkpoint's dtype
    out = judge.score_many([_history(1)], "Rate it.")
    assert len(out.scores) == 1 and policy_backend.calls == []


def test_build_judge_missing_folder(tmp_path):
    with pytest.raises(ConfigError, match="not a local HF model folder"):
        build_judge(JudgeConfig(model_path=str(tmp_path / "nope")), policy_backend=None, tokenizer=None)


def test_demonstrations_sit_between_the_rubric_and_the_transcript(tok):
    cfg = JudgeConfig(
        demonstrations=[
            {"role": "user", "content": "DEMO TRANSCRIPT"},
            {"role": "assistant", "content": "Score: 0"},
        ]
    )
    judge = LLMJudge(ScriptedBackend(["Score: 1"]), tok, cfg, max_prompt_tokens=400)
    text = tok.decode(judge.build_prompt([{"role": "user", "content": "REAL TASK"}], "THE RUBRIC"))
    assert (
        text.index("THE RUBRIC")
        < text.index("DEMO TRANSCRIPT")
        < text.index("Score: 0")
        < text.index("REAL TASK")
    )


def test_check_judge_config_names_the_bad_key(tmp_path):
    from nemo_azr.rewards.judge import check_judge_config

    with pytest.raises(ConfigError, match="on_parse_failure='drop'"):
        check_judge_config(JudgeConfig(on_parse_failure="drop"))
    with pytest.raises(ConfigError, match=r"demonstrations\[0\] needs role"):
        check_judge_config(JudgeConfig(demonstrations=[{"role": "system", "content": "x"}]))
    with pytest.raises(ConfigError, match="no such folder"):
        check_judge_config(JudgeConfig(model_path=str(tmp_path / "missing")))
    check_judge_config(JudgeConfig(model_path="smollm2-135m"))  # a preset name is accepted
