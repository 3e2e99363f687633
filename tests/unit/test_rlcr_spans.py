"""Span masks M_ans / M_conf on the real tiny tokenizer's ids, well-formed and malformed."""

import pytest

from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rlcr import answer_span_mask, confidence_span_mask, token_char_offsets


@pytest.fixture(scope="module")
def tok(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def _ids(tok, text: str, eos: bool = True) -> list[int]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return ids + [tok.eos_token_id] if eos else ids


def _expected_mask(tok, ids, span_text_start: int, span_text_end: int) -> list[int]:
    """Reference for ASCII text: offsets from per-token decoding, token in span iff it overlaps."""
    out, pos = [], 0
    for i in ids:
        piece = tok.decode([i], skip_special_tokens=True)
        start, end = pos, pos + len(piece)
        pos = end
        overlaps = end > span_text_start and start < span_text_end
        out.append(1 if overlaps else 0)
    return out


def _masked_text(tok, ids, mask) -> str:
    return tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=True)


def test_tags_are_plain_bpe_text_and_tokens_straddle_them(tok):
    pieces = [tok.decode([i]) for i in _ids(tok, "<analysis>It is correct.</analysis>", eos=False)]
    assert "<analysis>" not in pieces  # not a special token
    assert any(p.startswith(".") and p.endswith("</") for p in pieces)  # ".</" straddles a tag


def test_offsets_cover_the_text_exactly(tok):
    text = "x é日本 <think>😀 ok</think><answer>1</answer>"
    ids = _ids(tok, text)
    decoded, offsets = token_char_offsets(ids, tok)
    assert decoded == text
    assert offsets[0][0] == 0 and offsets[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(offsets, offsets[1:]))  # contiguous, no gaps or overlaps
    assert offsets[-1][0] == offsets[-1][1]  # eos decodes to nothing: zero width
    assert "".join(text[s:e] for s, e in offsets) == text
    zero_width = [i for i, (s, e) in enumerate(offsets[:-1]) if s == e]
    assert zero_width, "a multi-byte character split over tokens gives zero-width partial tokens"


def test_answer_mask_well_formed(tok):
    text = "ok <think>3 + 4</think><answer>7</answer> extra words"
    ids = _ids(tok, text)
    mask = answer_span_mask(ids, tok)
    start, end = text.index("<think>"), text.index("</answer>") + len("</answer>")
    assert mask == _expected_mask(tok, ids, start, end)
    assert _masked_text(tok, ids, mask).strip() == "<think>3 + 4</think><answer>7</answer>"
    assert mask[0] == 0 and mask[-1] == 0  # text before the span and eos after it are not trained
    first, last = mask.index(1), len(mask) - 1 - mask[::-1].index(1)
    assert all(mask[first : last + 1])  # one contiguous span


def test_answer_mask_straddling_token_at_the_start_is_included(tok):
    text = "ok <think>a</think><answer>7</answer>"
    ids = _ids(tok, text)
    mask = answer_span_mask(ids, tok)
    first = mask.index(1)
    assert tok.decode([ids[first]]) == " <"  # the space and the tag's "<" share one token: included
    assert tok.decode(ids[:first]) == "ok"


@pytest.mark.parametrize(
    ("text", "starts_at_first", "ends_at_eos"),
    [
        ("I guess <answer>7</answer> then", True, False),  # no <think>
        ("ok <think>3 + 4</think><answer>7", False, True),  # no </answer>
        ("no tags at all", True, True),
    ],
)
def test_answer_mask_malformed(tok, text, starts_at_first, ends_at_eos):
    ids = _ids(tok, text)
    mask = answer_span_mask(ids, tok)
    assert (mask[0] == 1) is starts_at_first
    assert (mask[-1] == 1) is ends_at_eos  # eos included when the closing tag is missing
    first, last = mask.index(1), len(mask) - 1 - mask[::-1].index(1)
    assert all(mask[first : last + 1])
    if not ends_at_eos:
        assert _masked_text(tok, ids, mask).endswith("</answer>")
        assert mask[-1] == 0


def test_confidence_mask_with_analysis(tok):
    text = "sure. <analysis>The sum is correct.</analysis><confidence>0.9</confidence>"
    ids = _ids(tok, text)
    mask = confidence_span_mask(ids, tok)
    start, end = text.index("<analysis>"), text.index("</confidence>") + len("</confidence>")
    assert mask == _expected_mask(tok, ids, start, end)
    assert _masked_text(tok, ids, mask).strip().startswith("<analysis>")
    assert _masked_text(tok, ids, mask).endswith("</confidence>")
    assert mask[-1] == 0


def test_confidence_mask_without_analysis_starts_at_confidence(tok):
    text = "blah <confidence>0.9</confidence>"
    ids = _ids(tok, text)
    mask = confidence_span_mask(ids, tok)
    start, end = text.index("<confidence>"), len(text)
    assert mask == _expected_mask(tok, ids, start, end)
    assert _masked_text(tok, ids, mask).strip() == "<confidence>0.9</confidence>"
    assert mask[0] == 0


@pytest.mark.parametrize(
    ("text", "starts_at_first"),
    [
        ("ok <analysis>hmm, maybe", False),  # no </confidence>: from <analysis> through eos
        ("0.9</confidence> junk <confidence>0.4", False),  # the only closing tag is before the opening
        ("nothing useful", True),  # no tags: every generated token
    ],
)
def test_confidence_mask_missing_closing_runs_to_eos(tok, text, starts_at_first):
    ids = _ids(tok, text)
    mask = confidence_span_mask(ids, tok)
    assert mask[-1] == 1  # eos included
    assert (mask[0] == 1) is starts_at_first
    first = mask.index(1)
    assert all(mask[first:])
    if not starts_at_first:
        assert _masked_text(tok, ids, mask).lstrip().startswith("<")


def test_empty_response(tok):
    assert answer_span_mask([], tok) == []
    assert confidence_span_mask([], tok) == []


@pytest.mark.parametrize(
    "text",
    [
        "<think>3 + 4</think><answer>7</answer>",
        "x é日本 <think>😀 ok</think><answer>1</answer> café — naïve",
        "  leading spaces\n<analysis>a.</analysis>\n<confidence>0.25</confidence>",
    ],
)
def test_windowed_offsets_equal_the_exact_prefix_method(tok, text):
    from nemo_azr.rlcr.spans import _incremental_deltas, _prefix_deltas

    ids = _ids(tok, text)
    fast = _incremental_deltas(ids, tok)
    exact = _prefix_deltas(ids, tok, text)
    assert "".join(fast) == text
    assert fast == exact


@pytest.mark.parametrize(
    ("prefill", "text"),
    [
        ("<confidence>", "0.3</confidence> and then more"),
        ("<analysis>", "I am sure.</analysis><confidence>0.9</confidence> more"),
    ],
)
def test_confidence_mask_after_a_prefilled_opening_tag_starts_at_the_first_token(tok, prefill, text):
    """rlcr.confidence_prefill opened the tag in the context: the reply is masked from its first token
    to the closing tag (without the prefill, a reply holding <confidence> would start there)."""
    ids = _ids(tok, text)
    mask = confidence_span_mask(ids, tok, prefill=prefill)
    end = text.index("</confidence>") + len("</confidence>")
    assert mask == _expected_mask(tok, ids, 0, end)
    assert _masked_text(tok, ids, mask).endswith("</confidence>") and mask[-1] == 0
    if "<confidence>" in text:
        assert confidence_span_mask(ids, tok)[0] == 0
