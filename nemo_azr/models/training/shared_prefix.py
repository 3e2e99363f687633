"""Shared-prefix forward for the hf backend (``model.shared_prefix``): a prefix several rows of a
micro-batch start with runs once.

RLCR's confidence turn is the case it is for: the ``G_c`` confidences of an answer share the whole
turn-2 context (~300 tokens with a chat template and demonstrations) and differ only in their ~20
generated tokens, so the padded forward computes that context ``G_c`` times; sampled answers
(``G_a`` per prompt) and GRPO's ``n_samples`` share their prompt the same way.

The micro-batch's leading columns, up to the first trained token of any row, run once per distinct
prefix with the KV cache kept (differentiable); the cache is expanded to the rows that share it and
the remaining columns run on it. The hidden states ``[B, T, H]`` are the plain forward's (to fp32
tolerance) at every position, prefix included, so log-probs, losses, values and gradients are
unchanged: a shared prefix's gradient is the sum over its rows through the expanded cache.

Rows whose prompts differ often still open alike: self-play's solver prompts all start with the same
system prompt and demonstration (~230 tokens on SmolLM2), and differ only in the question. When no
two rows of a micro-batch share their leading columns (prompts are left-padded, so an opening common
to all rows sits at a different column in each), the *common start* is used instead: the longest run
of real tokens every row begins with runs once (batch 1), its cache is expanded to every row, and
each row's other columns (its left padding, then the rest of its tokens) run on it. Of the two, the
layout that runs fewer token columns is used.

Written by hand: transformers shares a prefix only at generation time (its prefix caching); nothing
in it trains through one.
"""

from __future__ import annotations

import inspect

import torch


def shared_prefix_width(loss_mask: torch.Tensor | None, width: int) -> int:
    """Columns before the first trained token of any row that has one (``width`` when none has,
    or when there is no mask): the part of each row whose tokens no row's loss reads directly."""
    if loss_mask is None:
        return width
    trained = loss_mask > 0
    rows = trained.any(dim=1)
    if not bool(rows.any()):
        return width
    first = trained[rows].int().argmax(dim=1)
    return int(first.min())


def distinct_rows(
    ids: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Rows with the same (ids, mask) content: ``(first, inverse)``, the first row of each distinct
    content and each row's index into ``first``; ``None`` when every row differs."""
    b = ids.shape[0]
    key = torch.cat([ids, attention_mask.to(ids.dtype)], dim=1)
    unique, inverse = torch.unique(key, dim=0, return_inverse=True)
    if unique.shape[0] == b:
        return None
    first = torch.full((unique.shape[0],), b, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, torch.arange(b, device=ids.device), reduce="amin")
    return first, inverse


def shared_prefix_decoder_forward(
    decoder: torch.nn.Module,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    prefix_width: int,
) -> torch.Tensor | None:
    """``decoder``'s last hidden states ``[B, T, H]`` with the first ``prefix_width`` columns computed
    once per distinct (ids, mask) prefix, or the leading real tokens common to every row computed
    once (:func:`common_start`), whichever runs fewer token columns; ``None`` when no two rows share
    either (the caller runs the plain forward)."""
    b, t = ids.shape
    p = min(prefix_width, t)
    if b < 2:
        return None
    groups = distinct_rows(ids[:, :p], attention_mask[:, :p]) if p >= 1 else None
    start = common_start(ids, attention_mask)
    # token columns each layout runs: G prefixes of p then every row's rest, or one common start
    grouped_cost = len(groups[0]) * p + b * (t - p) if groups is not None else b * t
    if start is not None and start[1] + b * (t - start[1]) < grouped_cost:
        return _common_start_forward(decoder, ids, attention_mask, position_ids, *start)
    if groups is None:
        return None
    first, inverse = groups
    cache_kw = cache_keyword(decoder)
    out = decoder(
        input_ids=ids[first, :p],
        attention_mask=attention_mask[first, :p],
        position_ids=position_ids[first, :p],
        use_cache=p < t,
    )
    prefix_hidden = out.last_hidden_state[inverse]
    if p == t:
        return prefix_hidden
    cache = getattr(out, cache_kw)
    cache.batch_select_indices(inverse)  # each row gets its prefix's keys and values (autograd-tracked)
    rest = decoder(
        input_ids=ids[:, p:],
        attention_mask=attention_mask,
        position_ids=position_ids[:, p:],
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state
    return torch.cat([prefix_hidden, rest], dim=1)


def cache_keyword(decoder: torch.nn.Module) -> str:
    """transformers >= 5 names the KV cache ``cache`` (in and out); earlier ones ``past_key_values``."""
    params = inspect.signature(decoder.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


# An opening shorter than this runs with its rows: it saves little against one more forward call and a
# cache copy, and short-prompt jobs (the default job's 16-token prompts) keep the arithmetic they
# were measured with (decision 206)
MIN_COMMON_START = 32


def common_start(
    ids: torch.Tensor, attention_mask: torch.Tensor, min_tokens: int = MIN_COMMON_START
) -> tuple[torch.Tensor, int] | None:
    """``(starts, c)``: each row's first real column and the number ``c`` of leading real tokens all
    rows share, kept below the shortest row's length so every row has a token of its own; ``None``
    when they share fewer than ``min_tokens`` or a row's real tokens are not one contiguous run (a
    layout this does not know)."""
    real = attention_mask > 0
    lengths = real.sum(dim=1)
    starts = real.int().argmax(dim=1)
    columns = torch.arange(ids.shape[1], device=ids.device)
    contiguous = real == ((columns >= starts[:, None]) & (columns < (starts + lengths)[:, None]))
    shortest = int(lengths.min())
    if shortest < 2 or not bool(contiguous.all()):
        return None
    leading = ids.gather(1, starts[:, None] + torch.arange(shortest - 1, device=ids.device))
    differs = (leading != leading[:1]).any(dim=0)
    c = int(differs.int().argmax()) if bool(differs.any()) else shortest - 1
    return (starts, c) if c >= max(1, min_tokens) else None


def _common_start_forward(
    decoder: torch.nn.Module,
    ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    starts: torch.Tensor,
    c: int,
) -> torch.Tensor:
    """Hidden states ``[B, T, H]`` with the ``c`` leading real tokens every row shares run once.

    Row ``i``'s shared tokens sit at columns ``starts[i] .. starts[i]+c-1``; its other ``T - c``
    columns, in order (left padding, then its own tokens), run on the expanded cache with the padding
    masked. Causal order is kept: in every row the shared tokens come before all of its own."""
    b, t = ids.shape
    cache_kw = cache_keyword(decoder)
    row0 = int(starts[0])
    out = decoder(
        input_ids=ids[:1, row0 : row0 + c],
        attention_mask=attention_mask[:1, row0 : row0 + c],
        position_ids=position_ids[:1, row0 : row0 + c],
        use_cache=True,
    )
    cache = getattr(out, cache_kw)
    cache.batch_select_indices(torch.zeros(b, dtype=torch.long, device=ids.device))
    own = own_columns(starts, c, t)
    own_mask = attention_mask.gather(1, own)
    rest = decoder(
        input_ids=ids.gather(1, own),
        attention_mask=torch.cat([own_mask.new_ones(b, c), own_mask], dim=1),
        position_ids=position_ids.gather(1, own),
        use_cache=True,
        **{cache_kw: cache},
    ).last_hidden_state
    h = rest.shape[-1]
    shared_cols = starts[:, None] + torch.arange(c, device=ids.device)
    hidden = rest.new_zeros(b, t, h)
    hidden = hidden.scatter(
        1, shared_cols[..., None].expand(-1, -1, h), out.last_hidden_state.expand(b, -1, -1)
    )
    return hidden.scatter(1, own[..., None].expand(-1, -1, h), rest)


def own_columns(starts: torch.Tensor, c: int, width: int) -> torch.Tensor:
    """``[B, width - c]``: each row's columns outside its common start (``starts[i] .. starts[i]+c-1``),
    in order: its left padding, then the rest of its tokens."""
    base = torch.arange(width - c, device=starts.device).expand(len(starts), -1)
    return base + c * (base >= starts[:, None])
