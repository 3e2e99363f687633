"""Preference pairs: JSONL in and out, pairs generated from the arithmetic task or from scored
replies, and the preference batch (``nemo_azr/contracts/preference.py``) built from them.

A pair file has one JSON object per line: ``prompt``, ``chosen`` and ``rejected`` (the user's message
and two assistant replies), and an optional ``id``. Every problem in a file is a :class:`DataError`
naming the line, as for the question/answer files (``tasks/jsonl.py``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nemo_azr.contracts import Batch
from nemo_azr.contracts import fields as F
from nemo_azr.contracts.assemble import pack_prompt_response
from nemo_azr.contracts.task import Example
from nemo_azr.errors import DataError
from nemo_azr.rollout.single_turn import encode_prompt
from nemo_azr.tasks.jsonl import read_text_lines

__all__ = [
    "LabelledReply",
    "PreferencePair",
    "arithmetic_pairs",
    "example_pair",
    "example_reply",
    "pair_examples",
    "load_pairs_jsonl",
    "load_unpaired_jsonl",
    "mismatched_partners",
    "pairs_from_scored_replies",
    "pairs_to_batch",
    "unpaired_examples",
    "unpaired_to_batch",
    "write_pairs_jsonl",
    "write_unpaired_jsonl",
]

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    id: str
    prompt: str
    chosen: str
    rejected: str


@dataclass(frozen=True)
class LabelledReply:
    """One unpaired example (KTO): a reply to ``prompt`` that is desirable or not."""

    id: str
    prompt: str
    completion: str
    desirable: bool


UNPAIRED_FIELDS = ("prompt", "completion", "label")


def _json_rows(
    path: str | Path, what: str, fields: Sequence[str]
) -> tuple[Path, list[tuple[str, dict, str]]]:
    """(file, [(where, row, id)]) of a JSONL file: each non-blank line a JSON object with a unique
    ``id`` (default ``line<N>``); a broken line is a :class:`DataError` naming it."""
    file = Path(path).expanduser()
    rows, seen = [], set()
    for number, line in enumerate(read_text_lines(file, what=what), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with {', '.join(fields)}")
        row_id = str(row.get("id", f"line{number}"))
        if row_id in seen:
            raise DataError(f"{where}: duplicate id {row_id!r}")
        seen.add(row_id)
        rows.append((where, row, row_id))
    return file, rows


def load_unpaired_jsonl(path: str | Path) -> list[LabelledReply]:
    """Read and check a file of unpaired examples, one ``{"prompt", "completion", "label"[, "id"]}``
    object per line (``label``: true / false, or 1 / 0); every problem is a :class:`DataError` naming
    the line. KTO needs both labels somewhere in the file."""
    file, lines = _json_rows(path, "unpaired preference examples", UNPAIRED_FIELDS)
    rows = []
    for where, row, row_id in lines:
        missing = [
            k for k in ("prompt", "completion") if not isinstance(row.get(k), str) or not row[k].strip()
        ]
        if missing:
            raise DataError(f"{where}: missing or empty text field(s) {missing}")
        label = row.get("label")
        if label not in (True, False, 0, 1) or isinstance(label, float):
            raise DataError(f"{where}: label must be true / false (or 1 / 0), got {label!r}")
        rows.append(LabelledReply(row_id, row["prompt"], row["completion"], bool(label)))
    if not rows:
        raise DataError(
            f"{file} has no examples; expected one JSON object per line with {', '.join(UNPAIRED_FIELDS)}"
        )
    if len({r.desirable for r in rows}) < 2:
        raise DataError(
            f"{file}: every example is labelled {rows[0].desirable}; KTO needs desirable and undesirable ones"
        )
    return rows


def write_unpaired_jsonl(rows: Sequence[LabelledReply], path: str | Path) -> None:
    """One JSON object per example (``id``, ``prompt``, ``completion``, ``label``)."""
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(
        json.dumps({"id": r.id, "prompt": r.prompt, "completion": r.completion, "label": r.desirable}) + "\n"
        for r in rows
    )
    file.write_text(text, encoding="utf-8")


def load_pairs_jsonl(path: str | Path) -> list[PreferencePair]:
    """Read and check a pair file; every problem is a :class:`DataError` naming the line."""
    file, lines = _json_rows(path, "preference pairs", PAIR_FIELDS)
    pairs = []
    for where, row, pair_id in lines:
        missing = [k for k in PAIR_FIELDS if not isinstance(row.get(k), str) or not row[k].strip()]
        if missing:
            raise DataError(f"{where}: missing or empty text field(s) {missing}")
        if row["chosen"].strip() == row["rejected"].strip():
            raise DataError(f"{where}: chosen and rejected are the same reply; a pair must differ")
        pairs.append(PreferencePair(pair_id, row["prompt"], row["chosen"], row["rejected"]))
    if not pairs:
        raise DataError(
            f"{file} has no pairs; expected one JSON object per line with {', '.join(PAIR_FIELDS)}"
        )
    return pairs


def write_pairs_jsonl(pairs: Sequence[PreferencePair], path: str | Path) -> None:
    """One JSON object per pair (``id``, ``prompt``, ``chosen``, ``rejected``)."""
    file = Path(path).expanduser()
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs), encoding="utf-8")


#: How a generated arithmetic reply is written: ``bare`` ("27"), ``equation`` ("48 - 21 = 27", the
#: restated equation instruct models answer with; the task's reader accepts both).
PAIR_STYLES = ("bare", "equation")


def arithmetic_pairs(
    examples: Sequence[Example], *, seed: int = 0, style: str = "bare"
) -> list[PreferencePair]:
    """For each arithmetic problem: the right answer (chosen) against a near miss, the answer off by
    1 to 3 and never negative (rejected), both written in ``style``, as the task's replies are read."""
    if style not in PAIR_STYLES:
        raise ValueError(f"pair style {style!r} is not one of {PAIR_STYLES}")
    rng = random.Random(seed)
    pairs = []
    for ex in examples:
        gold = int(ex.answer)
        wrong = gold
        while wrong == gold or wrong < 0:
            wrong = gold + rng.choice((-3, -2, -1, 1, 2, 3))
        lead = f"{ex.meta['a']} {ex.meta['op']} {ex.meta['b']} = " if style == "equation" else ""
        pairs.append(PreferencePair(ex.prompt_id, ex.question, f"{lead}{gold}", f"{lead}{wrong}"))
    return pairs


def pairs_from_scored_replies(
    pair_id: str, prompt: str, replies: Sequence[str], rewards: Sequence[float], *, seed: int = 0
) -> PreferencePair | None:
    """One pair from a prompt's sampled replies ranked by the rule reward: a best-rewarded reply
    against a worst one (drawn at random among ties); None when every reward is the same."""
    if len(replies) != len(rewards):
        raise ValueError(f"{len(replies)} replies but {len(rewards)} rewards")
    if not replies or max(rewards) == min(rewards):
        return None
    rng = random.Random(seed)
    best = [r for r, w in zip(replies, rewards) if w == max(rewards)]
    worst = [r for r, w in zip(replies, rewards) if w == min(rewards)]
    return PreferencePair(pair_id, prompt, rng.choice(best), rng.choice(worst))


def pair_examples(pairs: Sequence[PreferencePair]) -> list[Example]:
    """The pairs as prompt-loader examples (the loader shuffles, batches and resumes them as it does
    prompts): the prompt as the question, the chosen reply as the answer, the pair in ``meta``."""
    return [Example(p.id, p.prompt, p.chosen, {"pair": p}) for p in pairs]


def example_pair(example: Example) -> PreferencePair:
    """The pair an :func:`pair_examples` example carries."""
    return example.meta["pair"]


def example_reply(example: Example) -> LabelledReply:
    """The labelled reply an :func:`unpaired_examples` example carries."""
    return example.meta["reply"]


def unpaired_examples(rows: Sequence[LabelledReply]) -> list[Example]:
    """Unpaired examples as prompt-loader examples (as :func:`pair_examples`), the row in ``meta``."""
    return [Example(r.id, r.prompt, r.completion, {"reply": r}) for r in rows]


def mismatched_partners(prompt_keys: Sequence[object]) -> list[int]:
    """For each row, the next row (cyclically) whose prompt differs: whose response KTO's mismatched
    row pairs with this row's prompt. :class:`DataError` when every row has the same prompt."""
    n = len(prompt_keys)
    partners = []
    for i, key in enumerate(prompt_keys):
        j = next((k % n for k in range(i + 1, i + n) if prompt_keys[k % n] != key), None)
        if j is None:
            raise DataError(
                "KTO's reference point needs at least two different prompts in a step's batch "
                "(raise data.prompts_per_step)"
            )
        partners.append(j)
    return partners


def pairs_to_batch(
    pairs: Sequence[PreferencePair],
    tokenizer,
    *,
    messages: Callable[[PreferencePair], list[dict]] | None = None,
    kl_rows: bool = False,
) -> Batch:
    """Two rows per pair (chosen, rejected): the chat-template prompt, the reply and EOS (trained),
    ``preference_label`` 1 / 0 and a shared ``pair_id``. ``messages`` gives a pair's prompt messages
    (a task's system prompt and demonstrations); by default the prompt is one user message.

    ``kl_rows`` (KTO) appends one mismatched row per row, ``kl_row`` meta True: the row's prompt with
    the response of the next row (cyclically) whose prompt differs, as TRL's KTO shifts completions
    within a batch; their mean log-ratio is the reference point. A batch whose rows all share one
    prompt has no mismatched response: :class:`DataError`."""
    prompts, replies, labels, pair_ids = [], [], [], []
    for pair in pairs:
        chat = messages(pair) if messages else [{"role": "user", "content": pair.prompt}]
        prompt = encode_prompt(tokenizer, chat)
        for reply, label in ((pair.chosen, 1), (pair.rejected, 0)):
            prompts.append(prompt)
            replies.append(reply)
            labels.append(label)
            pair_ids.append(pair.id)
    return _labelled_batch(prompts, replies, labels, tokenizer, {F.PAIR_ID: pair_ids}, kl_rows=kl_rows)


def unpaired_to_batch(rows: Sequence[LabelledReply], tokenizer, *, kl_rows: bool = True) -> Batch:
    """One row per unpaired example (the prompt as one user message, the reply and EOS trained),
    ``preference_label`` 1 desirable / 0 not; ``kl_rows`` as :func:`pairs_to_batch`."""
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": r.prompt}]) for r in rows]
    labels = [int(r.desirable) for r in rows]
    return _labelled_batch(prompts, [r.completion for r in rows], labels, tokenizer, {}, kl_rows=kl_rows)


def _labelled_batch(
    prompts: list[list[int]],
    replies: list[str],
    labels: list[int],
    tokenizer,
    meta: dict[str, list],
    *,
    kl_rows: bool,
) -> Batch:
    eos = tokenizer.eos_token_id
    responses = [[*tokenizer(reply, add_special_tokens=False)["input_ids"], eos] for reply in replies]
    if kl_rows:
        n = len(prompts)
        for i, j in enumerate(mismatched_partners([tuple(p) for p in prompts])):
            prompts.append(prompts[i])
            responses.append(responses[j])
            labels.append(0)  # not read: a kl_row has no label
        meta = {key: values + values for key, values in meta.items()}
        meta[F.KL_ROW] = [False] * n + [True] * n
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    batch = Batch(pack_prompt_response(prompts, responses, None, pad_id=pad), meta)
    batch[F.PREFERENCE_LABEL] = torch.tensor(labels)
    return batch
