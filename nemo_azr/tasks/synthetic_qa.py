"""A question-answering set generated locally, with answers a program can check.

Six kinds, from easy to hard for a small model, so that a calibrated model should be more confident
on some than on others (what RLCR trains):

- ``single_lookup``: a one-row table; read its value ("Prices: kiwi 16. What is the price of kiwi?");
- ``pair_lookup``: a two-row table; read one value (SmolLM2-135M: right about half the time sampled);
- ``table_lookup``: a four-row table; read one value ("What is the price of the plum?" -> 57);
- ``table_max``: the same tables; which entry is largest (-> "plum");
- ``word_add`` / ``word_sub``: two-digit addition / subtraction word problems (-> 38).

Everything is drawn from ``data.synthetic_qa.seed``, so the set is the same on every machine and no
data is downloaded. Answers are a number or one word; the accuracy reward compares numbers exactly and
words by normalised exact match.
"""

from __future__ import annotations

import random

from nemo_azr.config.schema import DataConfig
from nemo_azr.contracts.task import Example, Task
from nemo_azr.errors import ConfigError
from nemo_azr.registry import TASKS
from nemo_azr.tasks.answer_reward import AnswerReward

NAMES = ("Mia", "Tom", "Ava", "Leo", "Zoe", "Sam", "Ivy", "Max", "Eva", "Ben", "Lily", "Noah")
ITEMS = ("apples", "stickers", "marbles", "books", "coins", "cards", "shells", "pencils", "stamps", "beads")
# (what the table lists, the column, the word for the entry kind, entries)
TABLES = (
    ("Prices", "price", "fruit", ("apple", "pear", "plum", "fig", "kiwi", "lime", "mango", "peach")),
    ("Scores", "score", "team", ("Lions", "Bears", "Hawks", "Wolves", "Sharks", "Eagles", "Tigers", "Foxes")),
    ("Heights", "height", "tree", ("oak", "pine", "elm", "birch", "maple", "cedar", "ash", "willow")),
    ("Ages", "age", "person", ("Anna", "Ben", "Carl", "Dina", "Emil", "Fay", "Gus", "Hana")),
)
LOOKUP_ROWS = {"single_lookup": 1, "pair_lookup": 2, "table_lookup": 4}
TABLE_ROWS = 4
KINDS = ("single_lookup", "pair_lookup", "table_lookup", "table_max", "word_add", "word_sub")
MIN_VALUE, MAX_VALUE = 10, 99


def _table(rng: random.Random, rows: int = TABLE_ROWS) -> tuple[str, str, str, list[tuple[str, int]]]:
    title, column, entry_kind, names = rng.choice(TABLES)
    entries = rng.sample(names, rows)
    values = rng.sample(range(MIN_VALUE, MAX_VALUE + 1), rows)  # distinct: one maximum
    return title, column, entry_kind, list(zip(entries, values))


def _table_text(title: str, rows: list[tuple[str, int]]) -> str:
    return f"{title}: " + ", ".join(f"{name} {value}" for name, value in rows) + "."


def make_question(kind: str, rng: random.Random) -> tuple[str, str]:
    """(question, answer) of one ``kind``."""
    if kind in (*LOOKUP_ROWS, "table_max"):
        title, column, entry_kind, rows = _table(rng, LOOKUP_ROWS.get(kind, TABLE_ROWS))
        if kind != "table_max":
            name, value = rng.choice(rows)
            return f"{_table_text(title, rows)} What is the {column} of {name}?", str(value)
        name, _ = max(rows, key=lambda r: r[1])
        return f"{_table_text(title, rows)} Which {entry_kind} has the highest {column}?", name
    person, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = rng.randint(MIN_VALUE, MAX_VALUE), rng.randint(MIN_VALUE, MAX_VALUE)
    if kind == "word_add":
        return f"{person} has {a} {item} and gets {b} more. How many {item} does {person} have now?", str(
            a + b
        )
    a, b = max(a, b), min(a, b)
    return f"{person} had {a} {item} and gave away {b}. How many {item} does {person} have left?", str(a - b)


@TASKS.register("synthetic_qa")
class SyntheticQATask(AnswerReward, Task):
    """``data.synthetic_qa.num_examples`` questions, the kinds in turn, seeded."""

    name = "synthetic_qa"

    def __init__(self, cfg: DataConfig) -> None:
        super().__init__(cfg)
        qa = cfg.synthetic_qa
        kinds = list(dict.fromkeys(qa.kinds))
        unknown = [k for k in kinds if k not in KINDS]
        if not kinds or unknown:
            raise ConfigError(
                f"data.synthetic_qa.kinds={list(qa.kinds)} must be a non-empty subset of {list(KINDS)}"
            )
        if qa.num_examples < 1:
            raise ConfigError(f"data.synthetic_qa.num_examples must be >= 1, got {qa.num_examples}")
        rng = random.Random(qa.seed)
        self.examples = []
        for i in range(qa.num_examples):
            kind = kinds[i % len(kinds)]
            question, answer = make_question(kind, rng)
            self.examples.append(Example(f"qa-{i}", question, answer, {"kind": kind}))
