"""``nemo-azr train-rm`` on the hf backend: a transformers ``AutoModelForSequenceClassification`` with
one label on the base, trained with the Bradley-Terry loss over each step's pairs in one forward."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from nemo_azr.algorithms.bradley_terry import bradley_terry_loss
from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.models.hf.sequence_scores import last_token_scores, right_padded, score_head
from nemo_azr.models.training.optim import build_optimizer
from nemo_azr.models.training.reward_head import init_score_head_, reward_model_optim

__all__ = ["HFRewardModelTrainer"]

Rows = Sequence[tuple[list[int], list[int]]]


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


class HFRewardModelTrainer:
    """The base with a fresh one-label head (:func:`init_score_head_`), fp32, on the CPU or
    ``trainer.device``."""

    def __init__(self, base: Path, cfg: NemoAzrConfig, pad_id: int) -> None:
        from transformers import AutoModelForSequenceClassification

        with _quiet_transformers():  # its load report lists the new head as missing weights: expected here
            self.model = AutoModelForSequenceClassification.from_pretrained(
                base, num_labels=1, dtype=torch.float32, local_files_only=True
            )
        init_score_head_(score_head(self.model).weight, self.model.config.initializer_range, cfg.seed)
        self.model.config.pad_token_id = pad_id
        self.model.train()
        self.pad_id = pad_id
        optim = reward_model_optim(cfg)
        self.grad_clip = optim.grad_clip
        self.optimizer, _ = build_optimizer(self.model.parameters(), optim, total_steps=1)

    def _scores(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = right_padded([c for c, _ in rows] + [r for _, r in rows], self.pad_id)
        scores = last_token_scores(self.model, ids, mask)
        return scores[: len(rows)], scores[len(rows) :]

    def pair_step(self, rows: Rows) -> tuple[float, float, float]:
        chosen, rejected = self._scores(rows)
        loss, acc = bradley_terry_loss(chosen, rejected)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip))
        self.optimizer.step()
        return float(loss.detach()), float(acc), grad_norm

    @torch.no_grad()
    def pair_scores(self, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        self.model.eval()
        try:
            return self._scores(rows)
        finally:
            self.model.train()

    def write(self, folder: Path, tokenizer: Any) -> None:
        self.model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
