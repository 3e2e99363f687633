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
    once per distinct (ids, mask) prefix; ``None`` when no two rows share one (the caller runs the
    plain forward)."""
    b, t = ids.shape
    p = min(prefix_width, t)
    if p < 1 or b < 2:
        return None
    groups = distinct_rows(ids[:, :p], attention_mask[:, :p])
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
