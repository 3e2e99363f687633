"""Question/answer pairs from a local JSONL file, scored with the math-verify accuracy reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts.task import Example, Task
from nemo_azr.errors import DataError
from nemo_azr.registry import TASKS
from nemo_azr.tasks.answer_reward import AnswerReward

REQUIRED_FIELDS = ("question", "answer")
ID_FIELD = "id"


@TASKS.register("jsonl")
class JsonlTask(AnswerReward, Task):
    """One JSON object per line with ``question`` and ``answer`` (an optional ``id``)."""

    name = "jsonl"

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        self.examples = load_jsonl_examples(cfg.path)


def load_jsonl_examples(path: str | Path) -> list[Example]:
    """Read and validate the file; every problem is a :class:`DataError` naming the line."""
    if not str(path):
        raise DataError("data.path is empty; task=jsonl needs a JSONL file with question/answer fields")
    file = Path(path).expanduser()
    lines = read_text_lines(file, what="data.path")

    examples: list[Example] = []
    seen_ids: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue  # blank lines (e.g. a trailing newline) are not rows
        example = _parse_row(line, number, file)
        if example.prompt_id in seen_ids:
            raise DataError(f"{file}:{number}: duplicate id {example.prompt_id!r}")
        seen_ids.add(example.prompt_id)
        examples.append(example)
    if not examples:
        raise DataError(f"{file} has no rows; expected one JSON object per line with question and answer")
    return examples


def read_text_lines(file: Path, *, what: str) -> list[str]:
    """The lines of a UTF-8 text file; a missing or unreadable one is a :class:`DataError` (``what``
    names it: the config key or the kind of file)."""
    if not file.is_file():
        raise DataError(f"{what} {str(file)!r} does not exist or is not a file")
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read {str(file)!r} as UTF-8 text: {exc}") from exc


def _parse_row(line: str, number: int, file: Path) -> Example:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{file}:{number}: invalid JSON ({exc.msg})") from None
    if not isinstance(row, dict):
        raise DataError(f"{file}:{number}: expected a JSON object, got {type(row).__name__}")
    values = {name: _text_field(row, name, number, file) for name in REQUIRED_FIELDS}
    prompt_id = str(row[ID_FIELD]) if row.get(ID_FIELD) is not None else f"line-{number}"
    meta = {k: v for k, v in row.items() if k not in (*REQUIRED_FIELDS, ID_FIELD)}
    return Example(prompt_id=prompt_id, question=values["question"], answer=values["answer"], meta=meta)


def _text_field(row: dict[str, Any], name: str, number: int, file: Path) -> str:
    if name not in row:
        raise DataError(f"{file}:{number}: missing field {name!r} (each row needs {list(REQUIRED_FIELDS)})")
    value = row[name]
    # bool is an int subclass, but true/false is not a question or an answer
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise DataError(
            f"{file}:{number}: field {name!r} must be a string or a number, got {type(value).__name__}"
        )
    if not value.strip():
        raise DataError(f"{file}:{number}: field {name!r} is empty")
    return value
