"""Span masks (seed 003): which generated tokens of a turn receive that turn's advantage.

``M_ans``: from the start of ``<think>`` to the end of ``</answer>``.
``M_conf``: from the start of ``<analysis>`` (or ``<confidence>`` when there is no analysis) to the
end of ``</confidence>``.

Masks are computed on token ids. Tags are ordinary BPE text for most tokenizers, and one token may
straddle a tag boundary (``".</"``), so the character offsets of each generated token come from the
tokenizer itself by incremental decoding (``decode(ids[:k])``), never from re-tokenising a string.
A token is in the span when its characters overlap the span's characters.

Malformed output (decision in the issue): a missing opening tag starts the span at the first
generated token; a missing closing tag ends it at the last generated token (eos included).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from nemo_azr.rlcr.parsing import (
    ANALYSIS_OPEN,
    ANSWER_CLOSE,
    CONFIDENCE_CLOSE,
    CONFIDENCE_OPEN,
    THINK_OPEN,
)

_REPLACEMENT_CHAR = "\ufffd"  # what decode() shows for an incomplete UTF-8 sequence


def _decode(tokenizer, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)


def _incremental_deltas(ids: list[int], tokenizer) -> list[str]:
    """The text each token adds, by windowed incremental decoding (as inference servers stream text).

    ``decode(ids[prefix:k])`` minus ``decode(ids[prefix:read])``: the short prefix window keeps
    tokenizers that drop a leading space at the start of a decode honest, and a window that ends in
    an incomplete UTF-8 character adds nothing until a later token completes it. O(n x window).
    """
    deltas: list[str] = []
    prefix, read = 0, 0
    for k in range(1, len(ids) + 1):
        prefix_text = _decode(tokenizer, ids[prefix:read])
        new_text = _decode(tokenizer, ids[prefix:k])
        if len(new_text) > len(prefix_text) and not new_text.endswith(_REPLACEMENT_CHAR):
            deltas.append(new_text[len(prefix_text) :])
            prefix, read = read, k
        else:
            deltas.append("")
    return deltas


def _prefix_deltas(ids: list[int], tokenizer, text: str) -> list[str]:
    """Exact but O(n^2) fallback: token k ends where ``decode(ids[:k+1])`` ends."""
    deltas, prev_end = [], 0
    for k in range(1, len(ids) + 1):
        prefix = text if k == len(ids) else _decode(tokenizer, ids[:k])
        end = prev_end if prefix.endswith(_REPLACEMENT_CHAR) and k < len(ids) else len(prefix)
        end = min(max(end, prev_end), len(text))  # offsets never go backwards or past the text
        deltas.append(text[prev_end:end])
        prev_end = end
    return deltas


def token_char_offsets(token_ids: Sequence[int], tokenizer) -> tuple[str, list[tuple[int, int]]]:
    """The decoded text and each token's ``(start, end)`` character offsets in it.

    Offsets come from incremental decoding of the ids themselves. A token that stops inside a
    multi-byte character gets no characters; the token that completes the character gets them.
    Special tokens (eos) decode to nothing, so they are zero-width at their position. When the
    windowed deltas do not add up to the full decode (an unusual tokenizer), the exact prefix
    method is used instead.
    """
    ids = list(token_ids)
    text = _decode(tokenizer, ids)
    deltas = _incremental_deltas(ids, tokenizer)
    if "".join(deltas) != text:
        deltas = _prefix_deltas(ids, tokenizer, text)
    offsets, pos = [], 0
    for delta in deltas:
        offsets.append((pos, pos + len(delta)))
        pos += len(delta)
    return text, offsets


@dataclass(frozen=True)
class Span:
    """Inclusive token range ``[start, end]`` of a span and whether both tags were found."""

    start: int
    end: int
    has_open: bool
    has_close: bool

    def mask(self, length: int) -> list[int]:
        return [1 if self.start <= i <= self.end else 0 for i in range(length)]


def find_span(
    token_ids: Sequence[int], tokenizer, *, open_tags: Sequence[str], close_tag: str
) -> Span | None:
    """The token span from the earliest of ``open_tags`` to the end of the last ``close_tag`` after it.

    None for an empty response. Missing opening tag: start at token 0; missing closing tag: end at
    the last token.
    """
    n = len(token_ids)
    if n == 0:
        return None
    text, offsets = token_char_offsets(token_ids, tokenizer)
    found = [p for p in (text.find(tag) for tag in open_tags) if p >= 0]
    has_open = bool(found)
    open_char = min(found) if found else 0
    close_pos = text.rfind(close_tag, open_char)
    has_close = close_pos >= 0

    start = 0
    if has_open:  # the first token whose characters reach past the tag's first character
        start = next(i for i, (_, e) in enumerate(offsets) if e > open_char)
    end = n - 1
    if has_close:  # the last token that starts before the closing tag's end
        close_end = close_pos + len(close_tag)
        end = max(i for i, (s, _) in enumerate(offsets) if s < close_end)
    return Span(start=start, end=end, has_open=has_open, has_close=has_close)


def answer_span_mask(token_ids: Sequence[int], tokenizer) -> list[int]:
    """``M_ans`` over the generated ids of an answer turn: ``<think>`` .. ``</answer>``."""
    span = find_span(token_ids, tokenizer, open_tags=(THINK_OPEN,), close_tag=ANSWER_CLOSE)
    return span.mask(len(token_ids)) if span else []


def confidence_span_mask(token_ids: Sequence[int], tokenizer, *, prefill: str = "") -> list[int]:
    """``M_conf`` over the generated ids of a confidence turn: ``<analysis>``/``<confidence>`` .. ``</confidence>``.

    ``prefill`` (``rlcr.confidence_prefill``) is the start of the reply that was placed in the
    context: when it already opened a tag, the span starts at the first generated token.
    """
    open_tags = (ANALYSIS_OPEN, CONFIDENCE_OPEN)
    span = find_span(token_ids, tokenizer, open_tags=open_tags, close_tag=CONFIDENCE_CLOSE)
    if span and any(tag in prefill for tag in open_tags):
        span = replace(span, start=0, has_open=True)
    return span.mask(len(token_ids)) if span else []
