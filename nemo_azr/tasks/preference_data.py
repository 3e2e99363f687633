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
    "PreferencePair",
    "arithmetic_pairs",
    "example_pair",
    "pair_examples",
    "load_pairs_jsonl",
    "mismatched_partners",
    "pairs_from_scored_replies",
    "pairs_to_batch",
    "write_pairs_jsonl",
]

PAIR_FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    id: str
    prompt: str
    chosen: str
    rejected: str


def load_pairs_jsonl(path: str | Path) -> list[PreferencePair]:
    """Read and check a pair file; every problem is a :class:`DataError` naming the line."""
    file = Path(path).expanduser()
    lines = read_text_lines(file, what="preference pairs")
    pairs, seen = [], set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected a JSON object with {', '.join(PAIR_FIELDS)}")
        missing = [k for k in PAIR_FIELDS if not isinstance(row.get(k), str) or not row[k].strip()]
        if missing:
            raise DataError(f"{where}: missing or empty text field(s) {missing}")
        if row["chosen"].strip() == row["rejected"].strip():
            raise DataError(f"{where}: chosen and rejected are the same reply; a pair must differ")
        pair_id = str(row.get("id", f"line{number}"))
        if pair_id in seen:
            raise DataError(f"{where}: duplicate id {pair_id!r}")
        seen.add(pair_id)
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
    prompts, responses, labels, pair_ids = [], [], [], []
    eos = tokenizer.eos_token_id
    for pair in pairs:
        chat = messages(pair) if messages else [{"role": "user", "content": pair.prompt}]
        prompt = encode_prompt(tokenizer, chat)
        for reply, label in ((pair.chosen, 1), (pair.rejected, 0)):
            prompts.append(prompt)
            responses.append([*tokenizer(reply, add_special_tokens=False)["input_ids"], eos])
            labels.append(label)
            pair_ids.append(pair.id)
    meta: dict[str, list] = {F.PAIR_ID: pair_ids}
    if kl_rows:
        n = len(prompts)
        for i, j in enumerate(mismatched_partners([tuple(p) for p in prompts])):
            prompts.append(prompts[i])
            responses.append(responses[j])
            labels.append(0)  # not read: a kl_row has no label
            pair_ids.append(pair_ids[i])
        meta[F.KL_ROW] = [False] * n + [True] * n
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    batch = Batch(pack_prompt_response(prompts, responses, None, pad_id=pad), meta)
    batch[F.PREFERENCE_LABEL] = torch.tensor(labels)
    return batch
