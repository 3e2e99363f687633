"""Preference pairs: JSONL round trip and errors naming the line, arithmetic pairs scored by the
task's own reader, pairs from scored replies, and the batch they make."""

from __future__ import annotations

import json
import re

import pytest

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.preference import pair_rows, validate_preference_batch
from nemo_azr.errors import DataError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.tasks.arithmetic import ArithmeticTask
from nemo_azr.tasks.preference_data import (
    PreferencePair,
    arithmetic_pairs,
    load_pairs_jsonl,
    pairs_from_scored_replies,
    pairs_to_batch,
    write_pairs_jsonl,
)


def test_pairs_round_trip_through_jsonl(tmp_path):
    pairs = [PreferencePair("a", "What is 1 + 1?", "2", "3"), PreferencePair("b", "Hi", "Hello!", "...")]
    write_pairs_jsonl(pairs, tmp_path / "p.jsonl")
    assert load_pairs_jsonl(tmp_path / "p.jsonl") == pairs


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "p.jsonl:2: not valid JSON"),
        (
            json.dumps({"prompt": "q", "chosen": "a"}),
            r"p.jsonl:2: missing or empty text field\(s\) \['rejected'\]",
        ),
        (
            json.dumps({"prompt": "q", "chosen": "a", "rejected": " a "}),
            "p.jsonl:2: chosen and rejected are the same",
        ),
        (
            json.dumps({"id": "x", "prompt": "q", "chosen": "a", "rejected": "b"}),
            "p.jsonl:2: duplicate id 'x'",
        ),
    ],
)
def test_a_bad_pair_file_names_the_line(tmp_path, line, message):
    good = json.dumps({"id": "x", "prompt": "q", "chosen": "a", "rejected": "b"})
    (tmp_path / "p.jsonl").write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError, match=message):
        load_pairs_jsonl(tmp_path / "p.jsonl")


def test_arithmetic_pairs_are_right_against_a_near_miss_by_the_tasks_reader():
    cfg = DataConfig()
    cfg.arithmetic.operations = ["+", "-"]
    cfg.arithmetic.nonnegative = True
    task = ArithmeticTask(cfg)
    examples = task.examples[:200]
    pairs = arithmetic_pairs(examples, seed=3)
    assert [p.id for p in pairs] == [e.prompt_id for e in examples]
    for ex, pair in zip(examples, pairs):
        assert task.reward(ex, pair.chosen) == 1.0 and task.reward(ex, pair.rejected) == 0.0
        assert 1 <= abs(int(pair.rejected) - int(ex.answer)) <= 3 and int(pair.rejected) >= 0
    assert arithmetic_pairs(examples, seed=3) == pairs  # seeded
    # the restated equation: the same answers, written as the model writes them, still read right
    equations = arithmetic_pairs(examples, seed=3, style="equation")
    for ex, pair, eq in zip(examples, pairs, equations):
        lead = f"{ex.meta['a']} {ex.meta['op']} {ex.meta['b']} = "
        assert (eq.chosen, eq.rejected) == (lead + pair.chosen, lead + pair.rejected)
        assert task.reward(ex, eq.chosen) == 1.0 and task.reward(ex, eq.rejected) == 0.0
    with pytest.raises(ValueError, match="pair style 'prose'"):
        arithmetic_pairs(examples, style="prose")


def test_pairs_from_scored_replies_take_a_best_and_a_worst():
    pair = pairs_from_scored_replies("p", "q", ["a", "b", "c"], [0.0, 1.0, 0.5])
    assert (pair.chosen, pair.rejected) == ("b", "a")
    assert pairs_from_scored_replies("p", "q", ["a", "b"], [1.0, 1.0]) is None


def test_pairs_make_a_valid_preference_batch(tiny_model_path):
    tok = load_tokenizer(tiny_model_path)
    pairs = [PreferencePair("a", "What is 1 + 1?", "2", "3"), PreferencePair("b", "Hi", "Hello", "Go away")]
    batch = pairs_to_batch(pairs, tok)
    validate_preference_batch(batch, paired=True)
    chosen, rejected = pair_rows(batch)
    assert chosen.tolist() == [0, 2] and rejected.tolist() == [1, 3]
    assert batch.meta[F.PAIR_ID] == ["a", "a", "b", "b"]
    # the trained tokens are the reply and EOS, never the prompt
    row = batch[F.INPUT_IDS][1][batch[F.LOSS_MASK][1] > 0].tolist()
    assert row == [*tok("3", add_special_tokens=False)["input_ids"], tok.eos_token_id]


def test_the_pairs_workflow_presents_generated_pairs_as_the_task_does(tiny_model_path):
    from nemo_azr.rollout.single_turn import encode_prompt
    from nemo_azr.tasks.preference_data import pair_examples
    from nemo_azr.tasks.preference_workflow import PreferencePairsWorkflow

    tok = load_tokenizer(tiny_model_path)
    cfg = DataConfig()
    cfg.system_prompt = "Answer with a number."
    task = ArithmeticTask(cfg)
    pairs = arithmetic_pairs(task.examples[:3], seed=0)
    batch = PreferencePairsWorkflow(task, tok, task_prompts=True).run(
        pair_examples(pairs), None, None, step=0
    )
    validate_preference_batch(batch, paired=True)
    assert batch[F.REWARDS].tolist() == [1.0, 0.0] * 3  # the reward stage's output is the label
    assert len(set(batch.meta[F.UID])) == 6 and batch.meta[F.GROUP_ID] == batch.meta[F.PAIR_ID]
    assert batch.meta[F.RESPONSE_TEXT][:2] == [pairs[0].chosen, pairs[0].rejected]
    want = encode_prompt(tok, task.messages(task.examples[0]))  # system prompt included
    assert _prompt_tokens(batch, 0) == want
    plain = PreferencePairsWorkflow(task, tok, task_prompts=False).run(
        pair_examples(pairs), None, None, step=0
    )
    assert _prompt_tokens(plain, 0) == encode_prompt(tok, [{"role": "user", "content": pairs[0].prompt}])


def _prompt_tokens(batch, row: int) -> list[int]:
    """Row ``row``'s prompt: its real tokens outside the loss mask."""
    keep = (batch[F.ATTENTION_MASK][row] > 0) & (batch[F.LOSS_MASK][row] == 0)
    return batch[F.INPUT_IDS][row][keep].tolist()


def _response_tokens(batch, row: int) -> list[int]:
    return batch[F.INPUT_IDS][row][batch[F.LOSS_MASK][row] > 0].tolist()


def test_kto_batches_pair_each_prompt_with_another_prompts_response(tiny_model_path):
    """Row i + 4 is row i's prompt with the response of the next row whose prompt differs (rows 0, 1
    share pair a's prompt, so both take pair b's first row, as TRL's shifted completions would)."""
    from nemo_azr.contracts.preference import kto_rows

    tok = load_tokenizer(tiny_model_path)
    pairs = [PreferencePair("a", "What is 1 + 1?", "2", "3"), PreferencePair("b", "Hi", "Hello", "Go away")]
    batch = pairs_to_batch(pairs, tok, kl_rows=True)
    validate_preference_batch(batch, paired=False, kl_rows=True)
    examples, mismatched = kto_rows(batch)
    assert examples.tolist() == [0, 1, 2, 3] and mismatched.tolist() == [4, 5, 6, 7]
    for row, source in zip(range(4, 8), [2, 2, 0, 0]):
        assert _prompt_tokens(batch, row) == _prompt_tokens(batch, row - 4)
        assert _response_tokens(batch, row) == _response_tokens(batch, source)
    with pytest.raises(DataError, match="at least two different prompts"):
        pairs_to_batch(pairs[:1], tok, kl_rows=True)


def test_the_pairs_workflow_names_kto_mismatched_responses(tiny_model_path):
    from nemo_azr.tasks.preference_data import pair_examples
    from nemo_azr.tasks.preference_workflow import PreferencePairsWorkflow

    tok = load_tokenizer(tiny_model_path)
    task = ArithmeticTask(DataConfig())
    pairs = arithmetic_pairs(task.examples[:3], seed=0)
    batch = PreferencePairsWorkflow(task, tok, task_prompts=True, kl_rows=True).run(
        pair_examples(pairs), None, None, step=0
    )
    assert len(batch) == 12 and batch.meta[F.KL_ROW] == [False] * 6 + [True] * 6
    assert batch.meta[F.RESPONSE_TEXT][6:8] == [pairs[1].chosen, pairs[1].chosen]
    assert batch.meta[F.PROMPT_TEXT][6:8] == [pairs[0].prompt, pairs[0].prompt]
    assert len(set(batch.meta[F.UID])) == 12


UNPAIRED_LINES = [
    ('{"prompt": "Hi", "completion": "Hello", "label": true}', None),
    ('{"prompt": "Hi", "completion": "Go away", "label": 0}', None),
    ('{"prompt": "Hi", "completion": "Hello", "label": "yes"}', "label must be true / false"),
    ('{"prompt": "Hi", "label": true}', "missing or empty text field(s) ['completion']"),
    ('["Hi", "Hello"]', "expected a JSON object"),
]


@pytest.mark.parametrize(("line", "message"), [row for row in UNPAIRED_LINES if row[1]])
def test_a_bad_unpaired_file_names_the_line(tmp_path, line, message):
    from nemo_azr.tasks.preference_data import load_unpaired_jsonl

    path = tmp_path / "u.jsonl"
    path.write_text(UNPAIRED_LINES[0][0] + "\n" + line + "\n")
    with pytest.raises(DataError, match=rf"u.jsonl:2: {re.escape(message)}"):
        load_unpaired_jsonl(path)


def test_unpaired_examples_round_trip_and_need_both_labels(tmp_path):
    from nemo_azr.tasks.preference_data import LabelledReply, load_unpaired_jsonl, write_unpaired_jsonl

    rows = [LabelledReply("a", "Hi", "Hello", True), LabelledReply("b", "Q?", "No.", False)]
    write_unpaired_jsonl(rows, tmp_path / "u.jsonl")
    assert load_unpaired_jsonl(tmp_path / "u.jsonl") == rows
    write_unpaired_jsonl(rows[:1], tmp_path / "one.jsonl")
    with pytest.raises(DataError, match="every example is labelled True"):
        load_unpaired_jsonl(tmp_path / "one.jsonl")


def test_unpaired_rows_make_a_kto_batch(tiny_model_path):
    from nemo_azr.contracts.preference import kto_rows
    from nemo_azr.tasks.preference_data import LabelledReply, unpaired_examples
    from nemo_azr.tasks.preference_workflow import PreferencePairsWorkflow

    tok = load_tokenizer(tiny_model_path)
    rows = [LabelledReply("a", "Hi", "Hello", True), LabelledReply("b", "Q?", "No.", False)]
    batch = PreferencePairsWorkflow(ArithmeticTask(DataConfig()), tok, task_prompts=False, kl_rows=True).run(
        unpaired_examples(rows), None, None, step=0
    )
    validate_preference_batch(batch, paired=False, kl_rows=True)
    examples, mismatched = kto_rows(batch)
    assert batch[F.PREFERENCE_LABEL][examples].tolist() == [1, 0]
    assert batch.meta[F.RESPONSE_TEXT] == ["Hello", "No.", "No.", "Hello"]  # row 2: a's prompt, b's reply
    assert _prompt_tokens(batch, 2) == _prompt_tokens(batch, 0)
    assert _response_tokens(batch, 2) == _response_tokens(batch, 1)
