"""A sequence-classification head read by position: one score a row at its last real token, or a
score at every position (the reward model's, on the hf side of both training and scoring)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from nemo_azr.errors import ConfigError

__all__ = ["every_token_scores", "last_token_scores", "right_padded", "score_head"]


def right_padded(rows: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) ``[B, max_len]``, each row from position 0 (default positions hold)."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def last_token_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """One score per row: the classification head's logit at the row's last real token.

    Read here rather than from the model's own pooling, which finds the last token by the pad id
    (a reply token equal to it would move the read position); the head is the model's, so a folder
    from any library scores the same."""
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask)
    hidden = out.last_hidden_state
    last = attention_mask.sum(-1) - 1
    picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]
    return score_head(model)(picked).squeeze(-1).float()


def every_token_scores(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
) -> torch.Tensor:
    """``[B, T]``: the head's logit at every position, each the score of the sequence up to and
    including that token (what the head reads at a reply's last token, read everywhere)."""
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    return score_head(model)(out.last_hidden_state).squeeze(-1).float()


def score_head(model) -> torch.nn.Module:
    for name in ("score", "classifier"):  # transformers' names for the sequence-classification head
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            return head
    raise ConfigError(
        f"reward model {type(model).__name__}: no linear 'score' / 'classifier' head; a reward model is an "
        "AutoModelForSequenceClassification with num_labels=1"
    )
