"""Tasks (arithmetic, jsonl), build_task and the resumable prompt loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_azr.config.schema import ArithmeticTaskConfig, DataConfig
from nemo_azr.errors import CheckpointError, ConfigError, DataError
from nemo_azr.registry import TASKS
from nemo_azr.tasks import Example, build_task
from nemo_azr.tasks.arithmetic import ArithmeticTask
from nemo_azr.tasks.dataloader import PromptLoader
from nemo_azr.tasks.jsonl import JsonlTask


def _arith(**kwargs) -> DataConfig:
    return DataConfig(task="arithmetic", arithmetic=ArithmeticTaskConfig(**kwargs))


# ---------------------------------------------------------------- arithmetic


def test_arithmetic_all_problems() -> None:
    task = build_task(_arith(min_operand=0, max_operand=9, operations=["+"]))
    assert isinstance(task, ArithmeticTask) and task.name == "arithmetic"
    assert len(task.examples) == 100
    by_id = {e.prompt_id: e for e in task.examples}
    assert len(by_id) == 100
    three_plus_five = by_id["arith-3+5"]
    assert three_plus_five.question == "What is 3 + 5?"
    assert three_plus_five.answer == "8"
    assert by_id["arith-9+9"].answer == "18"
    assert by_id["arith-0+0"].answer == "0"


def test_arithmetic_operations_hand_checked() -> None:
    task = ArithmeticTask(_arith(min_operand=2, max_operand=4, operations=["+", "-", "*"]))
    assert len(task.examples) == 3 * 3 * 3
    answers = {e.question: e.answer for e in task.examples}
    assert answers["What is 2 - 4?"] == "-2"
    assert answers["What is 4 * 3?"] == "12"
    assert answers["What is 3 + 4?"] == "7"
    assert answers["What is 4 - 2?"] == "2"


def test_arithmetic_subset_is_seeded() -> None:
    cfg = _arith(max_operand=9, operations=["+", "*"], num_problems=17)
    first, second = ArithmeticTask(cfg), ArithmeticTask(cfg)
    assert len(first.examples) == 17
    assert [e.prompt_id for e in first.examples] == [e.prompt_id for e in second.examples]
    assert len({e.prompt_id for e in first.examples}) == 17
    other = ArithmeticTask(cfg, seed=1)
    assert [e.prompt_id for e in other.examples] != [e.prompt_id for e in first.examples]


def test_arithmetic_messages_reference_and_reward() -> None:
    task = ArithmeticTask(_arith(max_operand=5))
    example = next(e for e in task.examples if e.prompt_id == "arith-3+5")
    assert task.messages(example) == [{"role": "user", "content": "What is 3 + 5?"}]
    assert task.reference_response(example) == "8"
    assert task.reward(example, "8") == 1.0
    assert task.reward(example, "<answer>8</answer>") == 1.0
    assert task.reward(example, "9") == 0.0

    with_system = ArithmeticTask(DataConfig(system_prompt="Answer with a number."))
    assert with_system.messages(example) == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 3 + 5?"},
    ]


def test_arithmetic_question_template_and_nonnegative() -> None:
    task = ArithmeticTask(
        _arith(min_operand=10, max_operand=12, operations=["+", "-"], nonnegative=True,
               question_template="Compute {a} {op} {b}. Reply with just the number.")
    )  # fmt: skip
    by_id = {e.prompt_id: e for e in task.examples}
    # 9 additions + the 6 subtractions with a >= b (10-10, 11-10, 11-11, 12-10, 12-11, 12-12)
    assert len(task.examples) == 9 + 6 and "arith-10-11" not in by_id
    assert all(int(e.answer) >= 0 for e in task.examples)
    assert by_id["arith-12-10"].question == "Compute 12 - 10. Reply with just the number."
    assert by_id["arith-12-10"].answer == "2"


def test_messages_with_system_prompt_instruction_and_demonstrations() -> None:
    demos = [{"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "2"}]
    task = ArithmeticTask(_arith(max_operand=5))
    task.cfg = DataConfig(system_prompt="Be brief.", demonstrations=demos)
    example = task.examples[0]
    assert task.messages(example, instruction="Answer in tags.") == [
        {"role": "system", "content": "Be brief.\nAnswer in tags."},
        *demos,
        {"role": "user", "content": example.question},
    ]
    task.cfg = DataConfig(demonstrations=demos)
    assert task.messages(example)[0] == demos[0]  # no system message: the chat template's default applies


def test_held_out_split_is_disjoint_seeded_and_sized() -> None:
    cfg = _arith(min_operand=0, max_operand=9)
    cfg.eval_size = 30
    train, held = build_task(cfg, "train").examples, build_task(cfg, "eval").examples
    assert len(train) == 70 and len(held) == 30
    assert not {e.prompt_id for e in train} & {e.prompt_id for e in held}
    assert {e.prompt_id for e in train} | {e.prompt_id for e in held} == {
        e.prompt_id for e in build_task(cfg, "all").examples
    }
    assert [e.prompt_id for e in build_task(cfg, "eval").examples] == [e.prompt_id for e in held]
    cfg.split_seed = 1
    assert {e.prompt_id for e in build_task(cfg, "eval").examples} != {e.prompt_id for e in held}
    cfg.eval_size = 0  # no split: eval on everything
    assert len(build_task(cfg, "eval").examples) == len(build_task(cfg, "train").examples) == 100
    cfg.eval_size = 100
    with pytest.raises(DataError, match="leaves nothing to train on"):
        build_task(cfg)


def test_synthetic_qa_answers_follow_from_the_questions() -> None:
    import re

    cfg = DataConfig(task="synthetic_qa")
    cfg.synthetic_qa.kinds = ["single_lookup", *cfg.synthetic_qa.kinds]
    task = build_task(cfg, "all")
    assert len(task.examples) == 2000
    kinds = [e.meta["kind"] for e in task.examples]
    assert kinds[:6] == ["single_lookup", "pair_lookup", "table_lookup", "table_max", "word_add", "word_sub"]
    for e in task.examples:  # recompute every answer from the question text alone
        kind = e.meta["kind"]
        if kind.endswith(("lookup", "max")):
            rows = dict(re.findall(r"(\w+) (\d+)[,.]", e.question.split("?")[0]))
            assert len(rows) == {"single_lookup": 1, "pair_lookup": 2}.get(kind, 4)
            if kind.endswith("lookup"):
                name = re.search(r"of (\w+)\?$", e.question).group(1)
                assert e.answer == rows[name]
            else:
                assert e.answer == max(rows, key=lambda k: int(rows[k]))
        else:
            a, b = (int(x) for x in re.findall(r"\d+", e.question))
            assert int(e.answer) == (a + b if kind == "word_add" else a - b) and int(e.answer) >= 0
    again = build_task(cfg, "all")
    assert [e.question for e in again.examples] == [e.question for e in task.examples]
    assert task.reward(task.examples[1], f"<answer>{task.examples[1].answer}</answer>") == 1.0


@pytest.mark.parametrize(
    ("qa", "match"),
    [({"kinds": []}, "non-empty subset"), ({"kinds": ["riddles"]}, "subset"), ({"num_examples": 0}, ">= 1")],
)
def test_synthetic_qa_bad_config(qa: dict, match: str) -> None:
    from nemo_azr.config.schema import SyntheticQAConfig

    with pytest.raises(ConfigError, match=match):
        build_task(DataConfig(task="synthetic_qa", synthetic_qa=SyntheticQAConfig(**qa)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_operand": 5, "max_operand": 2},
        {"operations": []},
        {"operations": ["/"]},
        {"num_problems": -1},
        {"max_operand": 1, "num_problems": 5},  # only 4 problems exist
        {"question_template": "What is {a} plus {b}?"},  # {op} missing
        {"question_template": "What is {a} {op} {c}?"},
    ],
)
def test_arithmetic_bad_config(kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        ArithmeticTask(_arith(**kwargs))


# ---------------------------------------------------------------- jsonl


def _write(tmp_path: Path, lines: list[str]) -> str:
    file = tmp_path / "data.jsonl"
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(file)


def test_jsonl_loads_rows(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        [
            json.dumps({"question": "What is 2 + 2?", "answer": "4"}),
            "",
            json.dumps({"id": "q7", "question": "Half of 3?", "answer": 1.5, "source": "x"}),
            json.dumps({"question": 12, "answer": 12}),
        ],
    )
    task = build_task(DataConfig(task="jsonl", path=path))
    assert isinstance(task, JsonlTask)
    assert [e.prompt_id for e in task.examples] == ["line-1", "q7", "line-4"]
    assert [e.answer for e in task.examples] == ["4", "1.5", "12"]
    assert task.examples[2].question == "12"
    assert task.examples[1].meta == {"source": "x"}
    assert task.reward(task.examples[0], "4") == 1.0
    assert task.reward(task.examples[1], "3/2") == 1.0
    assert task.reward(task.examples[1], "2") == 0.0


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([], "no rows"),
        (["", "   "], "no rows"),
        (['{"question": "a", "answer": "b"}', "{not json"], r":2: invalid JSON"),
        (['{"question": "a"}'], r":1: missing field 'answer'"),
        (['{"answer": "a"}'], r":1: missing field 'question'"),
        (['["question", "answer"]'], r":1: expected a JSON object"),
        (['{"question": "a", "answer": true}'], "must be a string or a number"),
        (['{"question": "", "answer": "1"}'], "is empty"),
        (
            ['{"id": 1, "question": "a", "answer": "1"}', '{"id": 1, "question": "b", "answer": "2"}'],
            "duplicate id",
        ),
    ],
)
def test_jsonl_errors(tmp_path: Path, lines: list[str], match: str) -> None:
    path = _write(tmp_path, lines) if lines else str(tmp_path / "empty.jsonl")
    if not lines:
        Path(path).write_text("")
    with pytest.raises(DataError, match=match):
        JsonlTask(DataConfig(task="jsonl", path=path))


def test_jsonl_missing_or_unset_path(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        JsonlTask(DataConfig(task="jsonl", path=str(tmp_path / "nope.jsonl")))
    with pytest.raises(DataError, match="data.path is empty"):
        JsonlTask(DataConfig(task="jsonl", path=""))


def test_jsonl_not_utf8(tmp_path: Path) -> None:
    file = tmp_path / "latin1.jsonl"
    file.write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DataError, match="UTF-8"):
        JsonlTask(DataConfig(task="jsonl", path=str(file)))


# ---------------------------------------------------------------- build_task


def test_build_task_unknown_and_empty() -> None:
    with pytest.raises(ConfigError, match="unknown task"):
        build_task(DataConfig(task="nope"))
    assert {"arithmetic", "jsonl"} <= set(TASKS.names())


def test_build_task_empty_task_is_data_error(monkeypatch) -> None:
    class EmptyTask(ArithmeticTask):
        def __init__(self, cfg: DataConfig) -> None:
            super().__init__(cfg)
            self.examples = []

    monkeypatch.setitem(TASKS._entries, "test-empty", EmptyTask)  # kept out of the global registry
    with pytest.raises(DataError, match="no examples"):
        build_task(DataConfig(task="test-empty"))


# ---------------------------------------------------------------- loader


def _examples(n: int) -> list[Example]:
    return [Example(prompt_id=f"p{i}", question=f"q{i}", answer=str(i)) for i in range(n)]


def _ids(batch: list[Example]) -> list[str]:
    return [e.prompt_id for e in batch]


def test_loader_is_deterministic_and_covers_each_epoch() -> None:
    examples = _examples(10)
    a = PromptLoader(examples, 5, shuffle=True, seed=3)
    b = PromptLoader(examples, 5, shuffle=True, seed=3)
    batches_a = [_ids(a.next_batch()) for _ in range(6)]
    assert batches_a == [_ids(b.next_batch()) for _ in range(6)]
    for epoch in range(3):  # each epoch is a permutation of all prompts
        assert sorted(batches_a[2 * epoch] + batches_a[2 * epoch + 1]) == sorted(_ids(examples))
    assert batches_a[0] + batches_a[1] != batches_a[2] + batches_a[3]  # reshuffled per epoch
    other = PromptLoader(examples, 5, shuffle=True, seed=4)
    assert [_ids(other.next_batch()) for _ in range(2)] != batches_a[:2]


def test_loader_without_shuffle_and_wraparound() -> None:
    loader = PromptLoader(_examples(5), 3, shuffle=False, seed=0)
    assert _ids(loader.next_batch()) == ["p0", "p1", "p2"]
    assert _ids(loader.next_batch()) == ["p3", "p4", "p0"]  # spans two epochs, still full
    assert loader.state_dict()["epoch"] == 1


def test_loader_batch_larger_than_dataset() -> None:
    loader = PromptLoader(_examples(3), 8, shuffle=True, seed=0)
    batch = loader.next_batch()
    assert len(batch) == 8
    assert sorted(_ids(batch[:3])) == ["p0", "p1", "p2"]
    assert len(loader.next_batch()) == 8


def test_loader_resume_matches_uninterrupted_run() -> None:
    examples = _examples(7)
    original = PromptLoader(examples, 3, shuffle=True, seed=11)
    for _ in range(3):
        original.next_batch()
    state = original.state_dict()
    expected = [_ids(original.next_batch()) for _ in range(2)]  # the original's 4th and 5th

    resumed = PromptLoader(examples, 3, shuffle=True, seed=11)
    resumed.load_state_dict(state)
    assert [_ids(resumed.next_batch()) for _ in range(2)] == expected


def test_loader_errors() -> None:
    with pytest.raises(DataError):
        PromptLoader([], 4, shuffle=True, seed=0)
    with pytest.raises(ConfigError):
        PromptLoader(_examples(3), 0, shuffle=True, seed=0)
    loader = PromptLoader(_examples(3), 2, shuffle=True, seed=0)
    with pytest.raises(CheckpointError, match="saved for 5 prompts"):
        loader.load_state_dict({"epoch": 0, "position": 1, "num_examples": 5})
    with pytest.raises(CheckpointError):
        loader.load_state_dict({"epoch": 0})
