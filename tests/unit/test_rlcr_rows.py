"""benchmarks/rlcr_rows.py: asked rows and the join of answers with their stated confidence."""

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rlcr_rows  # noqa: E402


def test_asked_row_is_the_position_of_the_asked_name():
    assert rlcr_rows.asked_row("Ages: Dina 17, Fay 96. What is the age of Dina?") == 1
    assert (
        rlcr_rows.asked_row("Scores: Hawks 89, Foxes 42, Bears 78, Lions 87. What is the score of Lions?")
        == 4
    )
    assert rlcr_rows.asked_row("What is 3 + 4?") is None


def test_enumerated_candidate_rows_do_not_replace_the_stated_confidence(tmp_path: Path):
    # one answer, its decoded confidence 0.5, then the eleven scored candidates 0.0-1.0 (as an
    # evaluation with rlcr.analyses_per_answer writes them): the stated confidence stays 0.5
    question = "Prices: peach 30, plum 29. What is the price of plum?"
    base = {"prompt_id": "qa-0", "question": question, "kind": "pair_lookup"}
    records = [
        {**base, "sample_type": "answer", "reward": 1.0, "confidence": None, "finish_reason": "eos"},
        {
            **base,
            "sample_type": "confidence",
            "reward": 0.75,
            "confidence": 0.5,
            "finish_reason": "length",
            "expected_confidence": 0.42,
        },
    ]
    records += [
        {
            **base,
            "sample_type": "confidence",
            "reward": 1 - (1 - c / 10) ** 2,
            "confidence": c / 10,
            "finish_reason": "enumerated",
            "expected_confidence": 0.42,
        }
        for c in range(11)
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (answer,) = rlcr_rows.rows(tmp_path)
    assert answer["stated_confidence"] == 0.5
    assert answer["expected_confidence"] == 0.42


def test_single_turn_answers_carry_their_own_confidence_and_are_right_by_the_answer_check(tmp_path: Path):
    # single-turn records: no confidence rows; the reward (format + accuracy + Brier) is positive for
    # a wrong answer too, so rightness is the answer check's
    base = {"question": "Ages: Dina 17, Fay 96. What is the age of Dina?", "kind": "pair_lookup"}
    records = [
        {**base, "prompt_id": "qa-0", "sample_type": "answer", "reward": 0.69, "answer_correct": 0.0,
         "confidence": 0.9},
        {**base, "prompt_id": "qa-1", "sample_type": "answer", "reward": 2.46, "answer_correct": 1.0,
         "confidence": 0.8},
    ]  # fmt: skip
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "metrics.json").write_text(json.dumps({"by_kind": {"pair_lookup": {"auroc": 0.0}}}))
    wrong, right = rlcr_rows.rows(tmp_path)
    assert (wrong["right"], wrong["stated_confidence"]) == (False, 0.9)
    assert (right["right"], right["stated_confidence"]) == (True, 0.8)
    table = rlcr_rows.report(tmp_path)
    # one right and one wrong answer at AUROC 0: Hanley-McNeil gives Q1 = Q2 = 0, so no spread
    assert "| pair_lookup | 2 | 0.500 | 0.000 ± 0.000 | 2 | 0.800 | 0.900 |" in table


def test_answer_changes_count_same_replies_and_right_answers_lost_and_gained(tmp_path: Path):
    # three questions: one reply unchanged and right, one changed from right to wrong, one changed
    # from wrong to right; a fourth only in the trained evaluation is not compared
    def write(folder: Path, replies: list[tuple[str, str, float]]) -> Path:
        folder.mkdir()
        records = [
            {"prompt_id": pid, "question": "Ages: Dina 17, Fay 96. What is the age of Fay?", "kind": "pair_lookup",
             "sample_type": "answer", "response": text, "reward": right, "answer_correct": right}
            for pid, text, right in replies
        ]  # fmt: skip
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return folder

    before = write(tmp_path / "before", [("qa-0", "<answer>96</answer>", 1.0), ("qa-1", "<answer>17</answer>", 1.0),
                                         ("qa-2", "<answer>5</answer>", 0.0)])  # fmt: skip
    after = write(tmp_path / "after", [("qa-0", "<answer>96</answer>", 1.0), ("qa-1", "<answer>23</answer>", 0.0),
                                       ("qa-2", "<answer>96</answer>", 1.0), ("qa-9", "<answer>1</answer>", 0.0)])  # fmt: skip
    assert rlcr_rows.answer_changes(before, after) == {"compared": 3, "same": 1, "lost": 1, "gained": 1}


def test_unchanged_auroc_is_taken_over_the_answers_left_word_for_word(tmp_path: Path):
    # four pair_lookup answers unchanged (right: stated 0.9, 0.3; wrong: 0.5, 0.1) and one changed
    # (wrong, stated 0.95, left out). By hand over the unchanged: pairs (right, wrong) above = 0.9>0.5,
    # 0.9>0.1, 0.3>0.1, 0.3<0.5 -> 3/4; expected confidences equal for all -> 0.5. table_lookup: one
    # unchanged answer, one class only -> None.
    def write(folder: Path, replies: list[tuple[str, str, str, float, float]]) -> Path:
        folder.mkdir()
        records = []
        for pid, kind, text, right, conf in replies:
            base = {
                "prompt_id": pid,
                "question": "Ages: Dina 17, Fay 96. What is the age of Fay?",
                "kind": kind,
            }
            records.append(
                {**base, "sample_type": "answer", "response": text, "reward": right, "answer_correct": right}
            )
            records.append({**base, "sample_type": "confidence", "confidence": conf, "expected_confidence": 0.4,
                            "finish_reason": "eos"})  # fmt: skip
        (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        return folder

    before = write(tmp_path / "before", [
        ("q0", "pair_lookup", "a", 1.0, 0.1), ("q1", "pair_lookup", "b", 1.0, 0.1),
        ("q2", "pair_lookup", "c", 0.0, 0.1), ("q3", "pair_lookup", "d", 0.0, 0.1),
        ("q4", "pair_lookup", "e", 1.0, 0.1), ("q5", "table_lookup", "f", 1.0, 0.1)])  # fmt: skip
    after = write(tmp_path / "after", [
        ("q0", "pair_lookup", "a", 1.0, 0.9), ("q1", "pair_lookup", "b", 1.0, 0.3),
        ("q2", "pair_lookup", "c", 0.0, 0.5), ("q3", "pair_lookup", "d", 0.0, 0.1),
        ("q4", "pair_lookup", "moved", 0.0, 0.95), ("q5", "table_lookup", "f", 1.0, 0.7)])  # fmt: skip
    result = rlcr_rows.unchanged_auroc(before, after)
    assert result["pair_lookup"] == {"n": 4, "right": 2, "stated": 0.75, "expected": 0.5}
    assert result["table_lookup"] == {"n": 1, "right": 1, "stated": None, "expected": None}


def test_report_gives_each_kind_auroc_with_its_hanley_mcneil_error(tmp_path: Path):
    # three right answers (expected 0.8, 0.6, 0.4) and two wrong (0.5, 0.2): right outranks wrong in
    # 5 of 6 pairs -> expected AUROC 5/6. Hanley-McNeil by hand with A = 5/6, n_right 3, n_wrong 2:
    # Q1 = A/(2-A) = 5/7, Q2 = 2A^2/(1+A) = 25/33; var = (A(1-A) + 2(Q1-A^2) + 1(Q2-A^2)) / 6
    a = 5 / 6
    q1, q2 = 5 / 7, 25 / 33
    se = math.sqrt((a * (1 - a) + 2 * (q1 - a * a) + (q2 - a * a)) / 6)
    folder = tmp_path / "eval"
    folder.mkdir()
    records = []
    for pid, (right, expected) in enumerate([(1.0, 0.8), (1.0, 0.6), (1.0, 0.4), (0.0, 0.5), (0.0, 0.2)]):
        base = {"prompt_id": f"q{pid}", "question": "Ages: Dina 17, Fay 96. What is the age of Fay?",
                "kind": "pair_lookup"}  # fmt: skip
        records.append(
            {**base, "sample_type": "answer", "response": "96", "reward": right, "answer_correct": right}
        )
        records.append({**base, "sample_type": "confidence", "confidence": 0.5, "expected_confidence": expected,
                        "finish_reason": "eos"})  # fmt: skip
    (folder / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "metrics.json").write_text(json.dumps({"by_kind": {"pair_lookup": {"auroc": 0.5}}}))
    row = next(
        line for line in rlcr_rows.report(folder).splitlines() if line.startswith("| pair_lookup | 5 |")
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    # the written confidences are all 0.5: AUROC 0.5, whose error is Hanley-McNeil at A = 1/2
    q1_half, q2_half = 1 / 3, 1 / 3
    se_half = math.sqrt((0.25 + 2 * (q1_half - 0.25) + (q2_half - 0.25)) / 6)
    assert cells[3] == f"0.500 ± {se_half:.3f}"
    assert cells[7] == f"{a:.3f} ± {se:.3f}"


def test_a_folder_without_its_evaluation_files_is_a_usage_error(tmp_path: Path, monkeypatch, capsys):
    """An evaluation still running has no metrics.json yet: one line saying so, exit 2, no traceback."""
    (tmp_path / "samples.jsonl").write_text("")
    monkeypatch.setattr("sys.argv", ["rlcr_rows.py", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        rlcr_rows.main()
    assert exit_info.value.code == 2
    assert f"{tmp_path} has no metrics.json (is its nemo-azr eval finished?)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("response", "shape"),
    [
        ("<think>fig 23</think><answer>23</answer>", "listed number"),
        ("<answer>57</answer>", "listed number"),
        ("<answer>42</answer>", "unlisted number"),
        ("<answer>23 57</answer>", "several numbers"),
        ("<answer>23 23</answer>", "listed number"),  # one distinct number
        ("<answer>fig</answer>", "no number"),
        ("<think>fig 23</think><answer>23", "no answer tag"),  # runaway reply, tag never closed
        ("23", "no answer tag"),
    ],
)
def test_answer_shape_reads_the_answer_span_against_the_listed_numbers(response: str, shape: str):
    question = "Prices: pear 12, plum 57, fig 23. What is the price of fig?"
    assert rlcr_rows.answer_shape(question, response) == shape


def test_report_splits_each_kind_by_answer_shape(tmp_path: Path):
    question = "Prices: pear 12, plum 57. What is the price of plum?"
    answers = [
        ("<answer>57</answer>", 1.0, 0.9),
        ("<answer>12</answer>", 0.0, 0.7),
        ("<answer>12 57</answer>", 0.0, 0.1),
    ]
    records = []
    for i, (response, right, conf) in enumerate(answers):
        base = {"prompt_id": f"qa-{i}", "question": question, "kind": "pair_lookup"}
        records += [
            {**base, "sample_type": "answer", "response": response, "answer_correct": right, "reward": right},
            {**base, "sample_type": "confidence", "confidence": conf, "finish_reason": "eos"},
        ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "metrics.json").write_text(json.dumps({"by_kind": {}}))
    text = rlcr_rows.report(tmp_path)
    # two listed single numbers (one right), mean confidence (0.9 + 0.7) / 2; one list, never right
    assert "| pair_lookup | listed number | 2 | 1 | 0.800 |" in text
    assert "| pair_lookup | several numbers | 1 | 0 | 0.100 |" in text
    assert "unlisted number" not in text
