"""RLCR workflows with a scripted generation backend: rows, ids, masks, fused rewards, warm-up pairs."""

import math
import random
import re

import pytest
import torch

from nemo_azr.contracts import fields as F
from nemo_azr.contracts import validate_batch
from nemo_azr.contracts.generation import GenerationOutput, Sample, SamplingParams
from nemo_azr.contracts.task import Example
from nemo_azr.errors import BatchContractError, ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.preflight import load_config
from nemo_azr.registry import WORKFLOWS
from nemo_azr.rlcr import RLCR_INFO_KEY, SingleTurnRLCRWorkflow, TwoTurnRLCRWorkflow
from nemo_azr.rlcr.common import (
    ANSWER_CORRECT,
    CONFIDENCE,
    EXPECTED_CONFIDENCE,
    GREEDY_ANSWER,
    HAS_CONFIDENCE,
    turn_suffix_ids,
)
from nemo_azr.rlcr.warmup import confidence_target
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.tasks.arithmetic import ArithmeticTask


class ScriptedBackend:
    """Returns scripted texts (cycled) as token ids of the real tokenizer; records every call."""

    def __init__(self, tokenizer, answers, confidences):
        self.tok = tokenizer
        self.scripts = {"answer": list(answers), "confidence": list(confidences)}
        self.calls = []
        self.version = 3

    def generate(self, requests, sampling):
        kind = "answer" if not self.calls else "confidence"
        self.calls.append((kind, [list(r.prompt_ids) for r in requests], sampling))
        return _scripted_outputs(self.tok, requests, sampling, self.scripts[kind], self.version)


def _scripted_outputs(tok, requests, sampling, script, version):
    """``sampling.n`` samples per request, the texts of ``script`` in turn (cycled)."""
    outputs = []
    for r_i, req in enumerate(requests):
        samples = []
        for j in range(sampling.n):
            text = script[(r_i * sampling.n + j) % len(script)]
            ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            samples.append(Sample(ids, [-0.5] * len(ids), text, "eos"))
        outputs.append(GenerationOutput(req, samples, policy_version=version))
    return outputs


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def _cfg(tiny_cache, *extra):
    return load_config(["experiment=rlcr_two_turn", f"model.tiny.cache_dir={tiny_cache}", *extra])


def _examples():
    return [
        Example("arith-3+4", "What is 3 + 4?", "7", {"a": 3, "op": "+", "b": 4}),
        Example("arith-1+1", "What is 1 + 1?", "2", {"a": 1, "op": "+", "b": 1}),
    ]


def test_two_turn_rows_rewards_masks(tok, tiny_cache):
    cfg = _cfg(tiny_cache, "rlcr.num_generations_answer=2", "rlcr.num_generations_confidence=3")
    task = ArithmeticTask(cfg.data)
    wf = WORKFLOWS.get("rlcr_two_turn")(task, tok, cfg)
    answers = ["<think>3 + 4</think><answer>7</answer>", "<think>no</think><answer>9</answer>"]
    confidences = [
        "<analysis>ok</analysis><confidence>0.8</confidence>",
        "<confidence>0.2</confidence>",
        "<confidence>high</confidence>",  # parse failure: reward 0
    ]
    backend = ScriptedBackend(tok, answers, confidences)
    batch = wf.run(_examples(), backend, SamplingParams(n=8, max_new_tokens=30), step=5)
    validate_batch(batch, "reward")

    # two generate calls: turn 1 with G_a, turn 2 once with every (prompt, answer) pair and G_c
    assert [c[0] for c in backend.calls] == ["answer", "confidence"]
    assert backend.calls[0][2].n == 2 and backend.calls[1][2].n == 3
    assert len(backend.calls[1][1]) == 2 * 2
    assert backend.calls[0][2].max_new_tokens == cfg.rlcr.answer_max_new_tokens

    types = batch[F.SAMPLE_TYPE]
    assert types.count("answer") == 4 and types.count("confidence") == 12
    assert set(batch[F.ROLE]) == {"solver"}
    rewards = batch[F.REWARDS].tolist()
    for i, kind in enumerate(types):
        sub, group = batch[F.SUBGROUP_ID][i], batch[F.GROUP_ID][i]
        assert sub.startswith(group + "-a") and group.startswith("s5-p")
        acc = batch[ANSWER_CORRECT][i]
        gold_row = batch["example"][i]
        if kind == "answer":
            assert batch[HAS_CONFIDENCE][i] is False
            expected_acc = (
                1.0 if (gold_row.answer == "7" and "<answer>7<" in batch[F.RESPONSE_TEXT][i]) else 0.0
            )
            assert rewards[i] == acc == expected_acc
        else:
            c = batch[CONFIDENCE][i]
            expected = 0.0 if c is None else 1 - (acc - c) ** 2
            assert rewards[i] == pytest.approx(expected)
            # the confidence's label is its own answer's accuracy
            answer_row = batch[F.SUBGROUP_ID].index(sub)
            assert acc == batch[ANSWER_CORRECT][answer_row]

    # Token layout: real ids = context + generated ids; the trained ids are exactly the span.
    # Scripted sample k of every request is script[k % len]; G_a = 2 answers, G_c = 3 confidences.
    ids, mask, attn = batch[F.INPUT_IDS], batch[F.LOSS_MASK], batch[F.ATTENTION_MASK]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    for i, kind in enumerate(types):
        ex = batch["example"][i]
        prompt = encode_prompt(tok, task.messages(ex))
        answer_k = int(batch[F.SUBGROUP_ID][i].rsplit("-a", 1)[1])
        answer = answers[answer_k]
        real = ids[i][attn[i].bool()].tolist()
        trained = ids[i][mask[i].bool()].tolist()
        assert (mask[i] <= attn[i].float()).all()
        if kind == "answer":
            assert real == prompt + enc(answer) + [tok.eos_token_id]
            assert trained == enc(answer)  # M_ans: <think> .. </answer>, eos after it not trained
        else:
            h = int(batch[F.UID][i].rsplit("-c", 1)[1])
            conf = confidences[h]
            # turn 2 = turn-1 prompt + the answer's generated ids + the confidence request
            assert real == prompt + enc(answer) + wf.suffix_ids + enc(conf) + [tok.eos_token_id]
            assert trained == enc(conf)  # M_conf; the whole turn-2 context (incl. the answer) is 0
    assert tok.decode(wf.suffix_ids).startswith("<|im_end|>")
    assert cfg.rlcr.confidence_prompt in tok.decode(wf.suffix_ids)
    assert batch.info[RLCR_INFO_KEY] is cfg.rlcr
    m = batch.info["metrics"]
    assert m["rlcr/accuracy"] == pytest.approx(0.25)  # only prompt 0's first answer is right
    assert m["rlcr/confidence_format_fail_frac"] == pytest.approx(4 / 12)
    assert m["rlcr/answer_groups_spread_frac"] == pytest.approx(0.5)
    assert m["rlcr/confidence_groups_spread_frac"] == pytest.approx(1.0)
    assert sum(m[f"rlcr/conf_hist_bin_{k}"] for k in range(5)) == pytest.approx(1.0)


def _contains(seq, sub):
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_two_turn_confidence_mask_excludes_eos_and_prompt(tok, tiny_cache):
    cfg = _cfg(tiny_cache, "rlcr.num_generations_answer=2", "rlcr.num_generations_confidence=2")
    wf = TwoTurnRLCRWorkflow(ArithmeticTask(cfg.data), tok, cfg)
    backend = ScriptedBackend(tok, ["<think>a</think><answer>7</answer>"], ["<confidence>0.5</confidence>"])
    batch = wf.run(_examples()[:1], backend, SamplingParams(n=1, max_new_tokens=30), step=0)
    eos = tok.eos_token_id
    for i in range(len(batch)):
        trained = batch[F.INPUT_IDS][i][batch[F.LOSS_MASK][i].bool()].tolist()
        assert eos not in trained  # well-formed: the span ends at the closing tag
        full = tok.decode(trained)
        assert full in ("<think>a</think><answer>7</answer>", "<confidence>0.5</confidence>")


def test_single_turn_rewards_and_rows(tok, tiny_cache):
    cfg = load_config(
        ["experiment=rlcr_single_turn", f"model.tiny.cache_dir={tiny_cache}", "generation.n_samples=3"]
    )
    wf = WORKFLOWS.get("rlcr_single_turn")(ArithmeticTask(cfg.data), tok, cfg)
    assert isinstance(wf, SingleTurnRLCRWorkflow) and wf.rows_per_prompt == 3
    texts = [
        "<think>3 + 4</think><answer>7</answer><analysis>ok</analysis><confidence>0.9</confidence>",
        "<think>3 + 4</think><answer>8</answer><analysis>ok</analysis><confidence>0.9</confidence>",
        "<answer>7</answer>",
    ]
    backend = ScriptedBackend(tok, texts, [])
    batch = wf.run(_examples()[:1], backend, SamplingParams(n=3, max_new_tokens=40), step=0)
    r = cfg.rlcr
    expected = [
        r.format_weight + r.accuracy_weight + r.brier_weight * (1 - 0.1**2),
        r.format_weight + r.brier_weight * (1 - 0.9**2),
        r.accuracy_weight,
    ]
    assert batch[F.REWARDS].tolist() == pytest.approx(expected)
    assert set(batch[F.SAMPLE_TYPE]) == {"answer"} and all(batch[HAS_CONFIDENCE])
    # the whole response (eos included) is trained, the prompt is not
    assert batch[F.LOSS_MASK].sum(-1).tolist() == [
        len(tok(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts
    ]


def test_rlcr_dispatch_follows_multi_turn(tok, tiny_cache):
    cfg = _cfg(tiny_cache, "rollout.workflow=rlcr")
    task = ArithmeticTask(cfg.data)
    assert isinstance(WORKFLOWS.get("rlcr")(task, tok, cfg), TwoTurnRLCRWorkflow)
    cfg.rlcr.multi_turn = False
    assert isinstance(WORKFLOWS.get("rlcr")(task, tok, cfg), SingleTurnRLCRWorkflow)


def test_sft_pairs(tok, tiny_cache):
    cfg = _cfg(tiny_cache, "rlcr.warmup_wrong_frac=0.5")
    wf = TwoTurnRLCRWorkflow(ArithmeticTask(cfg.data), tok, cfg)
    examples = ArithmeticTask(cfg.data).examples[:40]
    pairs = wf.sft_pairs(examples)
    assert len(pairs) == 2 * len(examples)
    wrong = 0
    for (p_ans, t_ans), (p_conf, t_conf), ex in zip(pairs[::2], pairs[1::2], examples):
        answer_text = tok.decode(t_ans, skip_special_tokens=True)
        assert t_ans[-1] == tok.eos_token_id and t_conf[-1] == tok.eos_token_id
        assert answer_text.startswith("<think>") and answer_text.endswith("</answer>")
        wrong += f"<answer>{ex.answer}</answer>" not in answer_text
        # turn 2's context starts with turn 1's prompt and holds the answer
        assert p_conf[: len(p_ans)] == p_ans and _contains(p_conf, t_ans[:-1])
        conf_text = tok.decode(t_conf, skip_special_tokens=True)
        assert conf_text.startswith("<analysis>") and conf_text.endswith("</confidence>")
    assert 0 < wrong < len(examples)  # some, not all, deliberately wrong
    single = SingleTurnRLCRWorkflow(ArithmeticTask(cfg.data), tok, cfg).sft_pairs(examples[:3])
    assert len(single) == 3
    assert tok.decode(single[0][1], skip_special_tokens=True).endswith("</confidence>")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rlcr.num_generations_confidence=1"], "num_generations_confidence"),
        (["rlcr.num_generations_answer=1"], "num_generations_answer"),
        (["algorithm.estimator=grpo"], "rlcr_hierarchical"),
        (["rlcr.multi_turn=false"], "contradicts rlcr.multi_turn"),
        (["rlcr.answer_match=fuzzy"], "rlcr.answer_match"),
        (["rlcr.qa_match=bleu"], "rlcr.qa_match"),
        (["rlcr.f1_threshold=0"], "rlcr.f1_threshold"),
        (["eval.n_bins=0"], "eval.n_bins"),
        (["algorithm.mini_batch_size=7"], "G_a x (1 + G_c)"),
        (["rlcr.answer_decoding=beam"], "rlcr.answer_decoding"),
        (["rlcr.answer_decoding=greedy", "rlcr.num_generations_answer=2"], "num_generations_answer=1"),
        (["rlcr.answer_decoding=greedy_and_sample", "rlcr.num_generations_answer=1"], "must be >= 2"),
    ],
)
def test_config_validation(tiny_cache, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _cfg(tiny_cache, *overrides)


def test_config_validation_single_turn_and_other_workflows(tiny_cache):
    with pytest.raises(ConfigError, match="two-turn"):
        load_config(["experiment=rlcr_single_turn", "algorithm.estimator=rlcr_hierarchical"])
    with pytest.raises(ConfigError, match="rlcr_hierarchical needs rollout.workflow"):
        load_config(["algorithm.estimator=rlcr_hierarchical"])
    cfg = _cfg(tiny_cache, "algorithm.mini_batch_size=32")  # 8 prompts x 4 x (1 + 4) = 160 rows
    assert cfg.algorithm.mini_batch_size == 32


#: A chat format unlike ChatML, to show prompts come from the tokenizer's own template.
BRACKET_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)


def test_two_turn_prompts_use_the_models_chat_template_with_format_and_demonstrations(tok, tiny_cache):
    import copy

    bracket = copy.deepcopy(tok)
    bracket.chat_template = BRACKET_TEMPLATE
    demos = [
        "+data.demonstrations=[{role: user, content: 'What is 2 + 2?'}, "
        "{role: assistant, content: '<think>2 + 2 = 4</think><answer>4</answer>'}]",
        "rlcr.format_prompt=auto",
        "data.system_prompt=Be brief.",
        "rlcr.num_generations_answer=2",
        "rlcr.num_generations_confidence=2",
    ]
    cfg = _cfg(tiny_cache, *demos)
    task = ArithmeticTask(cfg.data)
    workflow = TwoTurnRLCRWorkflow(task, bracket, cfg)
    backend = ScriptedBackend(
        bracket, ["<think>3 + 4</think><answer>7</answer>"], ["<confidence>0.9</confidence>"]
    )
    workflow.run(_examples()[:1], backend, SamplingParams(n=2, max_new_tokens=16), step=0)

    (_, turn1, _), (_, turn2, _) = backend.calls
    expected_turn1 = (
        "[system] Be brief.\nReason inside <think></think>, then write only the final answer inside "
        "<answer></answer>.\n"
        "[user] What is 2 + 2?\n[assistant] <think>2 + 2 = 4</think><answer>4</answer>\n"
        "[user] What is 3 + 4?\n[assistant] "
    )
    assert bracket.decode(turn1[0]) == expected_turn1
    answer = "<think>3 + 4</think><answer>7</answer>"
    expected_turn2 = f"{expected_turn1}{answer}\n[user] {cfg.rlcr.confidence_prompt}\n[assistant] "
    assert bracket.decode(turn2[0]) == expected_turn2
    # the answer's ids are kept exactly as sampled inside the turn-2 context
    answer_ids = bracket(answer, add_special_tokens=False)["input_ids"]
    assert turn2[0][len(turn1[0]) : len(turn1[0]) + len(answer_ids)] == answer_ids


def test_sft_pairs_confidence_turn_only(tok, tiny_cache):
    """rlcr.warmup_answer_turn=false: only the confidence turn's pairs, in the same conversations."""
    examples = ArithmeticTask(_cfg(tiny_cache).data).examples[:12]
    both = TwoTurnRLCRWorkflow(ArithmeticTask(_cfg(tiny_cache).data), tok, _cfg(tiny_cache)).sft_pairs(
        examples
    )
    cfg = _cfg(tiny_cache, "rlcr.warmup_answer_turn=false")
    only = TwoTurnRLCRWorkflow(ArithmeticTask(cfg.data), tok, cfg).sft_pairs(examples)
    assert only == both[1::2]  # same seed: the confidence pairs of the both-turn warm-up, in order
    for context, target in only:
        assert "<confidence>" in tok.decode(target, skip_special_tokens=True)
        assert "<answer>" in tok.decode(context, skip_special_tokens=True)


def test_two_turn_greedy_answers_train_only_the_confidence_turn(tok, tiny_cache):
    """rlcr.answer_decoding=greedy: turn 1 is one argmax answer per prompt, kept in the batch (scored,
    logged) with an all-zero loss mask; turn 2 samples G_c confidences whose advantages are their Brier
    rewards minus their own answer's mean, exactly as with sampled answers."""
    cfg = _cfg(
        tiny_cache,
        "rlcr.answer_decoding=greedy",
        "rlcr.num_generations_answer=1",
        "rlcr.num_generations_confidence=2",
        "rlcr.scale_std=false",
        "rlcr.lambda_conf=1.0",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    answers = ["<think>3 + 4</think><answer>7</answer>"]  # right for prompt 0, wrong for prompt 1
    confidences = ["<confidence>0.9</confidence>", "<confidence>0.4</confidence>"]
    backend = ScriptedBackend(tok, answers, confidences)
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)
    validate_batch(batch, "reward")

    (_, _, turn1), (_, _, turn2) = backend.calls
    assert turn1.greedy and turn1.n == 1
    assert not turn2.greedy and turn2.n == 2 and turn2.temperature == 0.7
    types = batch[F.SAMPLE_TYPE]
    assert types.count("answer") == 2 and types.count("confidence") == 4
    mask = batch[F.LOSS_MASK]
    for i, kind in enumerate(types):
        assert bool(mask[i].any()) == (kind == "confidence")

    from nemo_azr.rlcr.advantages import rlcr_hierarchical

    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    # Brier rewards 1 - (acc - c)^2; baseline = the mean over the answer's two confidences
    right = [1 - (1 - 0.9) ** 2, 1 - (1 - 0.4) ** 2]
    wrong = [1 - 0.9**2, 1 - 0.4**2]
    expected = {
        "s0-p0-a0": [r - sum(right) / 2 for r in right],
        "s0-p1-a0": [r - sum(wrong) / 2 for r in wrong],
    }
    for i, kind in enumerate(types):
        row = advantages[i][mask[i].bool()]
        if kind == "answer":
            assert row.numel() == 0 and float(advantages[i].abs().sum()) == 0.0
        else:
            h = int(batch[F.UID][i].rsplit("-c", 1)[1])
            target = expected[batch[F.SUBGROUP_ID][i]][h]
            assert row.numel() > 0 and row.float().allclose(torch.full_like(row.float(), target), atol=1e-6)
    assert expected["s0-p0-a0"][0] > 0 > expected["s0-p1-a0"][0]  # sure pays when right, costs when wrong


class GreedyThenSampledBackend:
    """Turn 1 in two calls, greedy then sampled answers, each from its own script; then confidences."""

    def __init__(self, tokenizer, greedy, sampled, confidences):
        self.tok = tokenizer
        self.scripts = [list(greedy), list(sampled), list(confidences)]
        self.calls = []
        self.version = 3

    def generate(self, requests, sampling):
        script = self.scripts[min(len(self.calls), 2)]
        self.calls.append((len(self.calls), [list(r.prompt_ids) for r in requests], sampling))
        return _scripted_outputs(self.tok, requests, sampling, script, self.version)


def test_two_turn_greedy_and_sampled_answers(tok, tiny_cache):
    """rlcr.answer_decoding=greedy_and_sample: per prompt the argmax answer first (not trained, out of
    the answers' baseline), then G_a - 1 sampled answers normalised among themselves; every answer
    gets its confidences, normalised per answer as always."""
    cfg = _cfg(
        tiny_cache,
        "rlcr.answer_decoding=greedy_and_sample",
        "rlcr.num_generations_answer=3",
        "rlcr.num_generations_confidence=2",
        "rlcr.scale_std=false",
        "rlcr.lambda_ans=1.0",
        "rlcr.lambda_conf=1.0",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    greedy = ["<think>3 + 4</think><answer>7</answer>"]  # right for 3 + 4, wrong for 1 + 1
    sampled = [  # prompt 0: right, wrong; prompt 1: right, right
        "<think>3 + 4</think><answer>7</answer>",
        "<think>3 + 4</think><answer>9</answer>",
        "<think>1 + 1</think><answer>2</answer>",
        "<think>1 + 1</think><answer>2</answer>",
    ]
    confidences = ["<confidence>0.9</confidence>", "<confidence>0.4</confidence>"]
    backend = GreedyThenSampledBackend(tok, greedy, sampled, confidences)
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)
    validate_batch(batch, "reward")

    (_, _, first), (_, _, second), (_, _, third) = backend.calls
    assert first.greedy and first.n == 1
    assert not second.greedy and second.n == 2 and second.temperature == 0.7
    assert not third.greedy and third.n == 2
    types, uids, mask = batch[F.SAMPLE_TYPE], batch[F.UID], batch[F.LOSS_MASK]
    greedy_flags = batch[GREEDY_ANSWER]
    answers = {uids[i]: i for i, t in enumerate(types) if t == "answer"}
    assert sorted(answers) == [f"s0-p{p}-a{k}" for p in (0, 1) for k in range(3)]
    for uid, i in answers.items():
        is_greedy = uid.endswith("-a0")
        assert greedy_flags[i] is is_greedy and bool(mask[i].any()) is not is_greedy
    assert [batch[F.REWARDS][answers[f"s0-p{p}-a{k}"]].item() for p in (0, 1) for k in range(3)] == [
        1.0, 1.0, 0.0, 0.0, 1.0, 1.0,
    ]  # fmt: skip
    assert types.count("confidence") == 12  # 6 answers x 2 confidences, the greedy ones' included
    for i, t in enumerate(types):  # a confidence row carries its answer's flag
        if t == "confidence":
            assert greedy_flags[i] is batch[F.SUBGROUP_ID][i].endswith("-a0")

    from nemo_azr.rlcr.advantages import rlcr_hierarchical

    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    # sampled answers against their own mean: prompt 0 (1, 0) -> +0.5 / -0.5; prompt 1 (1, 1) -> 0.
    # With the greedy answer in the baseline they would be 1 - 2/3 and 0 - 2/3, and 1 - 2/3 twice.
    expected = {"s0-p0-a1": 0.5, "s0-p0-a2": -0.5, "s0-p1-a1": 0.0, "s0-p1-a2": 0.0}
    for uid, i in answers.items():
        row = advantages[i][mask[i].bool()]
        if uid.endswith("-a0"):
            assert float(advantages[i].abs().sum()) == 0.0
        else:
            assert row.numel() > 0 and row.float().allclose(torch.full_like(row.float(), expected[uid]))
    # the greedy wrong answer of prompt 1: its two confidences 0.9 / 0.4 -> Brier 0.19 / 0.84, mean 0.515
    conf = [i for i, t in enumerate(types) if t == "confidence" and batch[F.SUBGROUP_ID][i] == "s0-p1-a0"]
    got = sorted(round(float(advantages[i][mask[i].bool()][0]), 6) for i in conf)
    assert got == [round(0.19 - 0.515, 6), round(0.84 - 0.515, 6)]
    metrics = batch.info["metrics"]
    assert metrics["rlcr/greedy_answer_accuracy"] == 0.5 and metrics["rlcr/sampled_answer_accuracy"] == 0.75


def test_two_turn_confidence_prefill_is_context_parsed_with_the_reply(tok, tiny_cache):
    """rlcr.confidence_prefill: the confidence reply's start sits at the end of every turn-2 context
    (not generated, not trained); the model's "0.3</confidence>" parses as prefill + reply, and the loss
    mask covers the number and the closing tag from the first generated token."""
    cfg = _cfg(tiny_cache, 'rlcr.confidence_prefill="<confidence>"', "rlcr.num_generations_confidence=2")
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    answers = ["<think>3 + 4</think><answer>7</answer>"]  # right for prompt 0, wrong for prompt 1
    backend = ScriptedBackend(tok, answers, ["0.8</confidence> and more", "high</confidence>"])
    batch = wf.run(_examples(), backend, SamplingParams(n=4, temperature=0.7, max_new_tokens=30), step=0)
    validate_batch(batch, "reward")

    prefill_ids = tok("<confidence>", add_special_tokens=False)["input_ids"]
    (_, _, _), (_, contexts, _) = backend.calls
    for context in contexts:
        assert context[-len(prefill_ids) :] == prefill_ids
        assert cfg.rlcr.confidence_prompt in tok.decode(context[: -len(prefill_ids)])
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    assert len(rows) == 2 * 4 * 2
    for i in rows:
        h = int(batch[F.UID][i].rsplit("-c", 1)[1])
        acc = batch[ANSWER_CORRECT][i]
        if h == 0:  # "0.8</confidence> and more": Brier 1 - (acc - 0.8)^2
            assert batch[CONFIDENCE][i] == pytest.approx(0.8)
            assert float(batch[F.REWARDS][i]) == pytest.approx(1 - (acc - 0.8) ** 2)
        else:  # "high" does not parse: reward 0
            assert batch[CONFIDENCE][i] is None and float(batch[F.REWARDS][i]) == 0.0
        ids, mask = batch[F.INPUT_IDS][i].tolist(), batch[F.LOSS_MASK][i].tolist()
        first = mask.index(1)
        assert ids[first - len(prefill_ids) : first] == prefill_ids  # the prefill is context, not trained
        kept = tok.decode([t for t, m in zip(ids, mask) if m], skip_special_tokens=True)
        assert kept == ("0.8</confidence>" if h == 0 else "high</confidence>")


@pytest.mark.parametrize(
    ("prefill", "expected"),
    [
        ("<confidence>", r"0\.\d</confidence>"),
        ("<confidence>0.", r"\d</confidence>"),
        ("<analysis>", r".+</analysis>"),
    ],
)
def test_sft_pairs_continue_the_confidence_prefill(tok, tiny_cache, prefill, expected):
    cfg = _cfg(tiny_cache, f'rlcr.confidence_prefill="{prefill}"')
    wf = TwoTurnRLCRWorkflow(ArithmeticTask(cfg.data), tok, cfg)
    prefill_ids = tok(prefill, add_special_tokens=False)["input_ids"]
    for context, target in wf.sft_pairs(ArithmeticTask(cfg.data).examples[:6])[1::2]:
        assert context[-len(prefill_ids) :] == prefill_ids
        text = tok.decode(target, skip_special_tokens=True)
        assert re.match(expected, text) and text.endswith("</confidence>")


def test_confidence_prefill_validation(tiny_cache):
    with pytest.raises(ConfigError, match="must not close the <confidence> tag"):
        _cfg(tiny_cache, 'rlcr.confidence_prefill="<confidence>0.5</confidence>"')
    with pytest.raises(ConfigError, match="single turn has none"):
        load_config(["experiment=rlcr_single_turn", 'rlcr.confidence_prefill="<confidence>"'])
    with pytest.raises(ConfigError, match="no confidence target that continues"):
        confidence_target(random.Random(0), "<think>")


def test_two_turn_confidence_prompt_restates_question_and_answer(tok, tiny_cache):
    """{question} / {answer} in rlcr.confidence_prompt become each example's question and the answer
    as stated in its tag (the whole reply when it has none), in turn 2's context and in the warm-up's."""
    prompt = "Q: {question} A: {answer}. Sure?"
    cfg = _cfg(
        tiny_cache,
        f'rlcr.confidence_prompt="{prompt}"',
        "rlcr.num_generations_answer=2",
        "rlcr.num_generations_confidence=2",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    answers = ["<think>3 + 4</think><answer>7</answer>", "eight"]
    backend = ScriptedBackend(tok, answers, ["<confidence>0.5</confidence>"])
    wf.run(_examples(), backend, SamplingParams(n=2, temperature=0.7, max_new_tokens=30), step=0)
    (_, _, _), (_, contexts, _) = backend.calls
    texts = [tok.decode(c) for c in contexts]
    expected = [  # prompt-major, then answer: each prompt got both scripted answers
        "Q: What is 3 + 4? A: 7. Sure?",
        "Q: What is 3 + 4? A: eight. Sure?",
        "Q: What is 1 + 1? A: 7. Sure?",
        "Q: What is 1 + 1? A: eight. Sure?",
    ]
    assert len(texts) == len(expected)
    for text, request in zip(texts, expected):
        assert request in text
    example = _examples()[0]
    (_, _), (context, _) = wf.sft_pairs([example])
    assert "Q: What is 3 + 4? A: " in tok.decode(context)
    plain = _cfg(tiny_cache, "rlcr.num_generations_confidence=2")
    assert WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(plain.data), tok, plain)._suffix(example, "x") == (
        turn_suffix_ids(tok, plain.rlcr.confidence_prompt)
    )


#: one greedy answer per question, then the enumerated candidates 0.1, 0.5, 0.9 after the prefill
GREEDY_ENUMERATED = (
    "rlcr.answer_decoding=greedy",
    "rlcr.num_generations_answer=1",
    'rlcr.confidence_prefill="<confidence>"',
    "rlcr.confidence_decoding=enumerate",
    "rlcr.confidence_candidates=[0.1,0.5,0.9]",
)


class ScoringBackend(ScriptedBackend):
    """Also scores continuations (contracts.ScoresContinuations): candidate j of every context gets
    the log-prob ``log(probs[j])`` on its first token and 0 on the others; records the calls."""

    def __init__(self, tokenizer, answers, probs, confidences=()):
        super().__init__(tokenizer, answers, confidences)
        self.probs = probs
        self.scored = []

    def continuation_logprobs(self, prompts, continuations, *, temperature=1.0):
        self.scored.append((prompts, continuations, temperature))
        return [
            [[math.log(self.probs[j])] + [0.0] * (len(c) - 1) for j, c in enumerate(row)]
            for row in continuations
        ]


def test_two_turn_enumerated_confidences_weigh_every_candidate_by_its_probability(tok, tiny_cache):
    """rlcr.confidence_decoding=enumerate: nothing is sampled in turn 2; each answer gets one row per
    candidate, the candidate's tokens after the prefilled tag (trained) with the backend's log-probs,
    its Brier reward, and the advantage w_c (R_c - sum w R) of the expected Brier gradient."""
    cfg = _cfg(tiny_cache, *GREEDY_ENUMERATED, "rlcr.lambda_conf=1.0")
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    assert wf.rows_per_prompt == 1 + 3
    probs = [0.2, 0.3, 0.5]
    backend = ScoringBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], probs)  # right, then wrong
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)
    validate_batch(batch, "reward")
    assert [kind for kind, _, _ in backend.calls] == ["answer"]  # turn 2 samples nothing
    ((contexts, conts, temperature),) = backend.scored
    assert temperature == 0.7 and len(contexts) == 2
    cand_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in ("0.1", "0.5", "0.9")]
    assert conts == [cand_ids, cand_ids]

    from nemo_azr.rlcr.advantages import rlcr_hierarchical

    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    assert len(rows) == 2 * 3
    values = [0.1, 0.5, 0.9]
    for i in rows:
        h = int(batch[F.UID][i].rsplit("-c", 1)[1])
        acc = batch[ANSWER_CORRECT][i]
        ids, mask = batch[F.INPUT_IDS][i].tolist(), batch[F.LOSS_MASK][i]
        kept = [t for t, m in zip(ids, mask.tolist()) if m]
        assert kept == cand_ids[h]  # the candidate's tokens alone are trained
        assert batch[CONFIDENCE][i] == pytest.approx(values[h])
        rewards = [1 - (acc - v) ** 2 for v in values]
        assert float(batch[F.REWARDS][i]) == pytest.approx(rewards[h])
        logps = batch[F.ROLLOUT_LOGPROBS][i][mask.bool()]
        assert float(logps.sum()) == pytest.approx(math.log(probs[h]), abs=1e-6)
        mean = sum(p * r for p, r in zip(probs, rewards))
        row = advantages[i][mask.bool()].float()
        assert torch.allclose(row, torch.full_like(row, probs[h] * (rewards[h] - mean)), atol=1e-6)
    m = batch.info["metrics"]
    assert m["rlcr/confidence_mean"] == pytest.approx(0.2 * 0.1 + 0.3 * 0.5 + 0.5 * 0.9)
    assert m["rlcr/confidence_candidate_mass"] == pytest.approx(1.0)
    # the expected Brier reward, averaged over the right (acc 1) and the wrong (acc 0) answer
    exp_reward = [sum(p * (1 - (acc - v) ** 2) for p, v in zip(probs, values)) for acc in (1.0, 0.0)]
    assert m["rlcr/confidence_reward_mean"] == pytest.approx(sum(exp_reward) / 2)

    with pytest.raises(ConfigError, match="scores continuations"):  # a backend that cannot score
        wf.run(_examples(), ScriptedBackend(tok, ["7"], ["0.5"]), SamplingParams(n=8), step=1)


@pytest.mark.parametrize("baseline", ["answer", "batch"])
def test_two_turn_uniform_candidate_weights_through_the_estimator(tok, tiny_cache, baseline):
    """rlcr.candidate_weighting=uniform: the workflow's candidate rows get 1/K (R_c - mean of the
    answer's R) whatever the backend's probabilities; with rlcr.candidate_baseline=batch, (R_ic - the
    batch's mean R of value c) / K = (y_i - mean y)(2c - 1) / K for the Brier reward."""
    cfg = _cfg(
        tiny_cache,
        *GREEDY_ENUMERATED,
        "rlcr.lambda_conf=1.0",
        "rlcr.candidate_weighting=uniform",
        f"rlcr.candidate_baseline={baseline}",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    backend = ScoringBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], [0.2, 0.3, 0.5])
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)

    from nemo_azr.rlcr.advantages import rlcr_hierarchical

    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    accs = sorted({batch[ANSWER_CORRECT][i] for i in rows})
    assert accs == [0.0, 1.0]  # one right and one wrong answer: the contrast has something to contrast
    values = [0.1, 0.5, 0.9]
    for i in rows:
        h = int(batch[F.UID][i].rsplit("-c", 1)[1])
        acc = batch[ANSWER_CORRECT][i]
        rewards = [1 - (acc - v) ** 2 for v in values]
        if baseline == "answer":
            expected = (rewards[h] - sum(rewards) / 3) / 3
        else:
            expected = (acc - 0.5) * (2 * values[h] - 1) / 3
        mask = batch[F.LOSS_MASK][i].bool()
        row = advantages[i][mask].float()
        assert torch.allclose(row, torch.full_like(row, expected), atol=1e-6)


def test_two_turn_kind_baseline_contrasts_answers_of_one_kind(tok, tiny_cache):
    """rlcr.candidate_baseline=kind: the workflow puts each question's kind on its candidate rows,
    and the estimator contrasts an answer only with the answers of its kind. Two additions of kind
    "sum" (one right, one wrong: (y - 0.5)(2c - 1) / 3) and one of kind "other" (alone: 0)."""
    from nemo_azr.rlcr.advantages import rlcr_hierarchical
    from nemo_azr.rlcr.common import QUESTION_KIND

    cfg = _cfg(
        tiny_cache,
        *GREEDY_ENUMERATED,
        "rlcr.lambda_conf=1.0",
        "rlcr.candidate_weighting=uniform",
        "rlcr.candidate_baseline=kind",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    examples = [
        Example("arith-3+4", "What is 3 + 4?", "7", {"a": 3, "op": "+", "b": 4, "kind": "sum"}),
        Example("arith-1+1", "What is 1 + 1?", "2", {"a": 1, "op": "+", "b": 1, "kind": "sum"}),
        Example("arith-2+5", "What is 2 + 5?", "7", {"a": 2, "op": "+", "b": 5, "kind": "other"}),
    ]
    backend = ScoringBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], [0.2, 0.3, 0.5])
    sampling = SamplingParams(n=8, temperature=0.7, max_new_tokens=30)
    batch = wf.run(examples, backend, sampling, step=0)
    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    by_prompt = {ex.prompt_id: ex.meta["kind"] for ex in examples}
    assert [batch[QUESTION_KIND][i] for i in rows] == [by_prompt[batch[F.PROMPT_ID][i]] for i in rows]
    values = [0.1, 0.5, 0.9]
    for i in rows:
        h = int(batch[F.UID][i].rsplit("-c", 1)[1])
        acc = batch[ANSWER_CORRECT][i]
        expected = (acc - 0.5) * (2 * values[h] - 1) / 3 if batch[QUESTION_KIND][i] == "sum" else 0.0
        row = advantages[i][batch[F.LOSS_MASK][i].bool()].float()
        assert torch.allclose(row, torch.full_like(row, expected), atol=1e-6)
    assert {batch[ANSWER_CORRECT][i] for i in rows if batch[QUESTION_KIND][i] == "sum"} == {0.0, 1.0}

    backend = ScoringBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], [0.2, 0.3, 0.5])
    plain = wf.run(_examples(), backend, sampling, step=0)  # questions without a kind
    with pytest.raises(BatchContractError, match="carry none"):
        rlcr_hierarchical(plain, cfg.algorithm)


@pytest.mark.parametrize(
    ("greedy_answer_kl", "confidence_kl", "confidence_weight"),
    [
        (False, "rlcr.confidence_kl=false", 0.0),
        (True, "rlcr.confidence_kl=false", 0.0),
        (True, "rlcr.confidence_kl_weight=0.25", 0.25),
    ],
)
def test_two_turn_kl_rows_for_the_argmax_answers_only(
    tok, tiny_cache, greedy_answer_kl, confidence_kl, confidence_weight
):
    """rlcr.greedy_answer_kl puts each argmax answer's answer span in the loss mask (the span a
    sampled answer trains) with advantage 0; rlcr.confidence_kl=false gives the confidence rows KL
    weight 0 and the answers 1, rlcr.confidence_kl_weight=w gives them w. Without greedy_answer_kl
    the argmax answers stay out of the loss."""
    from nemo_azr.rlcr.advantages import rlcr_hierarchical
    from nemo_azr.rlcr.spans import answer_span_mask

    cfg = _cfg(
        tiny_cache,
        *GREEDY_ENUMERATED,
        "algorithm.kl.coef=0.1",
        f"rlcr.greedy_answer_kl={str(greedy_answer_kl).lower()}",
        confidence_kl,
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    backend = ScoringBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], [0.2, 0.3, 0.5])
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)
    kinds = batch[F.SAMPLE_TYPE]
    assert "confidence" in kinds
    assert batch[F.KL_WEIGHT].tolist() == [1.0 if k == "answer" else confidence_weight for k in kinds]
    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    answers = [i for i, k in enumerate(kinds) if k == "answer"]
    assert answers and all(batch[GREEDY_ANSWER][i] for i in answers)
    for i in answers:
        mask = batch[F.LOSS_MASK][i]
        response = batch[F.INPUT_IDS][i][mask > 0].tolist()
        if greedy_answer_kl:
            ids = tok("<think>3 + 4</think><answer>7</answer>", add_special_tokens=False)["input_ids"]
            spans = answer_span_mask(ids, tok)
            assert int(mask.sum()) == sum(spans) > 0
            assert response == [t for t, m in zip(ids, spans) if m]
        else:
            assert int(mask.sum()) == 0
        assert advantages[i].abs().max() == 0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rlcr.confidence_decoding=beam"], "rlcr.confidence_decoding"),
        (["rlcr.confidence_decoding=enumerate"], "rlcr.confidence_prefill='<confidence>'"),
        (["rlcr.expected_confidence_readout=true"], "rlcr.confidence_prefill='<confidence>'"),
        (
            [
                "rollout.workflow=rlcr_single_turn",
                "rlcr.multi_turn=false",
                "algorithm.estimator=grpo",
                "rlcr.expected_confidence_readout=true",
            ],
            "single turn has none",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "generation.backend=trtllm",
            ],
            "generation.backend=hf",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.confidence_candidates=[0.5,0.51]",
            ],
            "must differ",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.confidence_candidates=[0.5,1.5]",
            ],
            "values in [0, 1]",
        ),
        (["rlcr.analyses_per_answer=2"], "rlcr.confidence_decoding=enumerate"),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.analyses_per_answer=-1",
            ],
            "rlcr.analyses_per_answer must be >= 0",
        ),
        (["rlcr.candidate_weighting=uniform"], "weighs enumerated candidates"),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_weighting=softmax",
            ],
            "rlcr.candidate_weighting",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_baseline=batch",
            ],
            "set rlcr.candidate_weighting=uniform",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_baseline=kind",
            ],
            "rlcr.candidate_baseline=kind compares each candidate value",
        ),
        (["rlcr.candidate_baseline=question"], "rlcr.candidate_baseline"),
        (["rlcr.candidate_mass_coef=0.2"], "keeps the probability on the enumerated candidates"),
        (["algorithm.kl.coef=0.1", "rlcr.greedy_answer_kl=true"], "set rlcr.answer_decoding"),
        (
            ["rlcr.answer_decoding=greedy", "rlcr.num_generations_answer=1", "rlcr.greedy_answer_kl=true"],
            "algorithm.kl.coef > 0 with algorithm.kl.mode=loss",
        ),
        (["rlcr.confidence_kl=false"], "algorithm.kl.coef > 0 with algorithm.kl.mode=loss"),
        (["rlcr.confidence_kl_weight=0.1"], "algorithm.kl.coef > 0 with algorithm.kl.mode=loss"),
        (
            ["algorithm.kl.coef=0.1", "rlcr.confidence_kl_weight=-0.1"],
            "rlcr.confidence_kl_weight must be >= 0",
        ),
        (
            ["algorithm.kl.coef=0.1", "rlcr.confidence_kl=false", "rlcr.confidence_kl_weight=0.1"],
            "leave rlcr.confidence_kl_weight at 1",
        ),
        (
            [
                "rollout.workflow=rlcr_single_turn",
                "rlcr.multi_turn=false",
                "algorithm.estimator=grpo",
                "algorithm.kl.coef=0.1",
                "rlcr.confidence_kl_weight=0.5",
            ],
            "the single turn has one reply per row",
        ),
        (
            [
                "rollout.workflow=rlcr_single_turn",
                "rlcr.multi_turn=false",
                "algorithm.estimator=grpo",
                "algorithm.kl.coef=0.1",
                "rlcr.confidence_kl=false",
            ],
            "the single turn has one reply per row",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_batch_share=0.5",
            ],
            "set rlcr.candidate_baseline=batch",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_weighting=uniform",
                "rlcr.candidate_baseline=batch",
                "rlcr.candidate_batch_share=0",
            ],
            "rlcr.candidate_batch_share must be in (0, 1]",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_mass_coef=-0.1",
            ],
            "rlcr.candidate_mass_coef must be >= 0",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_weighting=uniform",
                "rlcr.candidate_level_coef=0.5",
            ],
            "rlcr.candidate_level_coef sets the level that the batch contrast leaves free",
        ),
        (
            [
                'rlcr.confidence_prefill="<confidence>"',
                "rlcr.confidence_decoding=enumerate",
                "rlcr.candidate_weighting=uniform",
                "rlcr.candidate_baseline=batch",
                "rlcr.candidate_level_coef=-1",
            ],
            "rlcr.candidate_level_coef must be >= 0",
        ),
    ],
)
def test_enumerated_confidence_config_validation(tiny_cache, overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _cfg(tiny_cache, *overrides)


def test_evaluation_decodes_the_confidence_of_an_enumerated_run(tok, tiny_cache):
    """`nemo-azr eval` of a run trained with enumerated confidences scores the confidence the model
    writes (one greedy reply per answer), not the candidate rows, and the expected confidence over
    the candidates beside it."""
    from nemo_azr.evaluation.run import eval_config

    cfg = _cfg(
        tiny_cache,
        'rlcr.confidence_prefill="<confidence>"',
        "rlcr.confidence_decoding=enumerate",
        "eval.greedy=true",
    )
    out = eval_config(cfg)
    assert out.rlcr.confidence_decoding == "sample" and out.rlcr.num_generations_confidence == 1
    assert out.rlcr.expected_confidence_readout
    assert cfg.rlcr.confidence_decoding == "enumerate"  # the run's own config is left alone
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(out.data), tok, out)
    probs = [0.0] * 11
    probs[2], probs[9] = 0.25, 0.75  # candidates 0.2 and 0.9
    backend = ScoringBackend(
        tok, ["<think>3 + 4</think><answer>7</answer>"], [p or 1e-300 for p in probs], ["0.7</confidence>"]
    )
    batch = wf.run(_examples(), backend, SamplingParams(n=1, greedy=True, max_new_tokens=30), step=0)
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    assert len(rows) == 2 and all(batch[CONFIDENCE][i] == pytest.approx(0.7) for i in rows)
    assert all(batch[EXPECTED_CONFIDENCE][i] == pytest.approx(0.25 * 0.2 + 0.75 * 0.9) for i in rows)


def test_expected_confidence_readout_beside_sampled_confidences(tok, tiny_cache):
    """rlcr.expected_confidence_readout in training: the sampled confidences keep their Brier rewards;
    each answer's expected confidence over the candidates is meta on its rows and in the step's
    rlcr/expected_* metrics (right answer: 0.5 * 0.1 + 0.5 * 0.9 = 0.5, Brier 0.25 for both)."""
    cfg = _cfg(
        tiny_cache,
        "rlcr.answer_decoding=greedy",
        "rlcr.num_generations_answer=1",
        'rlcr.confidence_prefill="<confidence>"',
        "rlcr.expected_confidence_readout=true",
        "rlcr.confidence_candidates=[0.1,0.9]",
    )
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    backend = ScoringBackend(
        tok, ["<think>3 + 4</think><answer>7</answer>"], [0.5, 0.5], ["0.8</confidence>", "0.6</confidence>"]
    )
    batch = wf.run(_examples(), backend, SamplingParams(n=2, temperature=0.7, max_new_tokens=30), step=0)
    assert [kind for kind, _, _ in backend.calls] == ["answer", "confidence"]  # still sampled
    rows = [i for i, t in enumerate(batch[F.SAMPLE_TYPE]) if t == "confidence"]
    assert len(rows) == 2 * cfg.rlcr.num_generations_confidence
    for i in rows:
        acc, c = batch[ANSWER_CORRECT][i], batch[CONFIDENCE][i]
        assert float(batch[F.REWARDS][i]) == pytest.approx(1 - (acc - c) ** 2)  # the sampled one's
        assert batch[EXPECTED_CONFIDENCE][i] == pytest.approx(0.5)
    m = batch.info["metrics"]
    assert m["rlcr/expected_confidence_mean"] == pytest.approx(0.5)
    assert m["rlcr/expected_brier_score"] == pytest.approx(0.25)
    assert "rlcr/confidence_mean" in m and m["rlcr/confidence_mean"] != pytest.approx(0.5)


class AnalysingBackend(ScriptedBackend):
    """Scripted answers and analyses; scores candidates by what the context says: after an analysis
    holding "unsure" candidate j has probability ``unsure[j]``, after any other ``sure[j]``."""

    def __init__(self, tokenizer, answers, analyses, sure, unsure):
        super().__init__(tokenizer, answers, analyses)
        self.sure, self.unsure = sure, unsure
        self.scored = []

    def continuation_logprobs(self, prompts, continuations, *, temperature=1.0):
        self.scored.append((prompts, continuations, temperature))
        out = []
        for prompt, row in zip(prompts, continuations):
            probs = self.unsure if "unsure" in self.tok.decode(prompt) else self.sure
            out.append([[math.log(probs[j])] + [0.0] * (len(c) - 1) for j, c in enumerate(row)])
        return out


def _analysis_cfg(tiny_cache, *extra):
    return _cfg(tiny_cache, *GREEDY_ENUMERATED, "rlcr.analyses_per_answer=2", *extra)


def test_analyses_before_enumerated_confidences(tok, tiny_cache):
    """rlcr.analyses_per_answer: per answer N analyses are sampled after the prefilled <analysis> tag
    (stopping at </analysis>), then every candidate is scored after each analysis and the
    <confidence> tag. An analysis row's reward is the expected Brier reward after it and its
    advantage is normalised over the answer's analyses; a candidate's is w_c (R_c - sum w R) over
    the candidates after its own analysis."""
    from nemo_azr.rlcr.advantages import rlcr_hierarchical
    from nemo_azr.rlcr.common import CANDIDATE_OF

    cfg = _analysis_cfg(tiny_cache)
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(cfg.data), tok, cfg)
    assert wf.rows_per_prompt == 1 + 2 * (1 + 3)
    sure, unsure = [0.1, 0.2, 0.7], [0.6, 0.3, 0.1]
    analyses = ["3 + 4 is 7, sure</analysis>", "unsure"]  # the second is not closed
    backend = AnalysingBackend(tok, ["<think>3 + 4</think><answer>7</answer>"], analyses, sure, unsure)
    batch = wf.run(_examples(), backend, SamplingParams(n=8, temperature=0.7, max_new_tokens=30), step=0)
    validate_batch(batch, "reward")
    assert len(batch) == 2 * wf.rows_per_prompt
    from nemo_azr.config.batch_shape import rows_per_step  # what the config checks size batches by

    assert rows_per_step(cfg)[0] == cfg.data.prompts_per_step * wf.rows_per_prompt

    (_, _, _), (kind, contexts, sampling) = backend.calls
    assert kind == "confidence" and sampling.n == 2 and "</analysis>" in sampling.stop_strings
    open_ids = tok("<analysis>", add_special_tokens=False)["input_ids"]
    prefill_ids = tok("<confidence>", add_special_tokens=False)["input_ids"]
    close_ids = tok("</analysis>", add_special_tokens=False)["input_ids"]
    assert all(ctx[-len(open_ids) :] == open_ids for ctx in contexts)
    ((scored, conts, temperature),) = backend.scored
    assert temperature == 0.7 and len(scored) == 2 * 2  # two answers x two analyses, one call
    for k, ctx in enumerate(scored):
        analysis_ids = tok(analyses[k % 2], add_special_tokens=False)["input_ids"]
        closing = [] if k % 2 == 0 else close_ids
        assert ctx == contexts[k // 2] + analysis_ids + closing + prefill_ids

    advantages, _ = rlcr_hierarchical(batch, cfg.algorithm)
    values = [0.1, 0.5, 0.9]
    kinds = batch[F.SAMPLE_TYPE]
    analysis_rows = [i for i, t in enumerate(kinds) if t == "confidence" and batch[CANDIDATE_OF][i] is None]
    candidate_rows = [i for i, t in enumerate(kinds) if t == "confidence" and batch[CANDIDATE_OF][i]]
    assert len(analysis_rows) == 4 and len(candidate_rows) == 12
    expected_reward = {}
    for i in analysis_rows:
        acc = batch[ANSWER_CORRECT][i]
        probs = unsure if "unsure" in batch[F.RESPONSE_TEXT][i] else sure
        rewards = [1 - (acc - v) ** 2 for v in values]
        expected_reward[batch[F.UID][i]] = sum(p * r for p, r in zip(probs, rewards))
        assert float(batch[F.REWARDS][i]) == pytest.approx(expected_reward[batch[F.UID][i]])
        assert batch[CONFIDENCE][i] == values[probs.index(max(probs))]  # what greedy decoding states
        assert batch[EXPECTED_CONFIDENCE][i] == pytest.approx(sum(p * v for p, v in zip(probs, values)))
        assert batch[HAS_CONFIDENCE][i]
        mask = batch[F.LOSS_MASK][i].bool()
        assert (
            int(mask.sum()) == len(tok(batch[F.RESPONSE_TEXT][i], add_special_tokens=False)["input_ids"]) + 1
        )
    for answer in {batch[F.SUBGROUP_ID][i] for i in analysis_rows}:
        pair = [i for i in analysis_rows if batch[F.SUBGROUP_ID][i] == answer]
        r = [expected_reward[batch[F.UID][i]] for i in pair]
        for i, mine, other in ((pair[0], r[0], r[1]), (pair[1], r[1], r[0])):
            want = 1.0 if mine > other else -1.0  # two analyses: (r - mean) / std = +-1
            row = advantages[i][batch[F.LOSS_MASK][i].bool()].float()
            assert torch.allclose(row, torch.full_like(row, want), atol=1e-4)
    for i in candidate_rows:
        analysis_uid = batch[CANDIDATE_OF][i]
        h = int(batch[F.UID][i].rsplit("-c", 1)[1])
        acc = batch[ANSWER_CORRECT][i]
        probs = unsure if analysis_uid.endswith("-n1") else sure
        rewards = [1 - (acc - v) ** 2 for v in values]
        assert not batch[HAS_CONFIDENCE][i]
        mask = batch[F.LOSS_MASK][i].bool()
        row = advantages[i][mask].float()
        want = probs[h] * (rewards[h] - expected_reward[analysis_uid])
        assert torch.allclose(row, torch.full_like(row, want), atol=1e-6)
    m = batch.info["metrics"]
    assert m["rlcr/analysis_closed_frac"] == pytest.approx(0.5)
    # per answer: the mean of the expected confidences after its two analyses
    mean_expected = (
        sum(p * v for p, v in zip(sure, values)) + sum(p * v for p, v in zip(unsure, values))
    ) / 2
    assert m["rlcr/confidence_mean"] == pytest.approx(mean_expected)


def test_evaluation_of_an_analysing_run_decodes_one_analysis(tok, tiny_cache):
    """`nemo-azr eval` of a run trained with analyses: one (greedy) analysis per answer, the likeliest
    candidate after it is the stated confidence and the candidates' mean the expected one."""
    from nemo_azr.evaluation.run import eval_config

    cfg = _analysis_cfg(tiny_cache, "eval.greedy=true")
    out = eval_config(cfg)
    assert out.rlcr.confidence_decoding == "enumerate" and out.rlcr.analyses_per_answer == 1
    assert cfg.rlcr.analyses_per_answer == 2  # the run's own config is left alone
    wf = WORKFLOWS.get("rlcr_two_turn")(ArithmeticTask(out.data), tok, out)
    backend = AnalysingBackend(
        tok,
        ["<think>3 + 4</think><answer>7</answer>"],
        ["unsure</analysis>"],
        [0.1, 0.2, 0.7],
        [0.2, 0.5, 0.3],
    )
    batch = wf.run(_examples(), backend, SamplingParams(n=1, greedy=True, max_new_tokens=30), step=0)
    stated = [i for i in range(len(batch)) if batch[HAS_CONFIDENCE][i]]
    assert len(stated) == 2 and all(batch[CONFIDENCE][i] == 0.5 for i in stated)
    assert all(
        batch[EXPECTED_CONFIDENCE][i] == pytest.approx(0.2 * 0.1 + 0.5 * 0.5 + 0.3 * 0.9) for i in stated
    )
