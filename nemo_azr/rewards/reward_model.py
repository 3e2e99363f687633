"""A reward model's score as the reward (seed 004, class 4: preference-as-reward).

A reward model is an HF ``AutoModelForSequenceClassification`` folder with one label (what
``nemo-azr train-rm`` writes, or any such model a user brings): it reads the prompt as the chat
template presents it, then the reply, and its logit at the reply's last token is the score. The
same encoding (:func:`reward_model_input`) is used to train it and to score rollouts with it, so
the training and the RL prompts match token for token.

The Bradley-Terry loss it is trained with lives in ``algorithms/bradley_terry.py`` and the
position-read head in ``models/hf/sequence_scores.py`` (both re-exported here), so the trainers of
both backends (``models/``) share them with this scorer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from nemo_azr.algorithms.bradley_terry import bradley_terry_loss
from nemo_azr.errors import ConfigError
from nemo_azr.models.hf.sequence_scores import every_token_scores, last_token_scores, right_padded
from nemo_azr.rollout.single_turn import encode_prompt

__all__ = ["RewardModel", "bradley_terry_loss", "every_token_scores", "reward_model_input", "right_padded"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reward_model_input(tokenizer, messages: list[dict], reply: str) -> list[int]:
    """The prompt through the chat template (ending with the assistant header), then the reply's
    tokens. No end-of-turn token: the score is read at the reply's last token, which is then the
    last real token whatever the tokenizer pads with."""
    return [*encode_prompt(tokenizer, messages), *tokenizer(reply, add_special_tokens=False)["input_ids"]]


class RewardModel:
    """A frozen reward model: ``score(messages, replies)`` -> one float per reply, batched;
    ``token_scores(input_ids, attention_mask)`` -> a score at every position of token rows."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: torch.device | str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
    ) -> None:
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(path).expanduser()
        if not (folder / "config.json").is_file():
            raise ConfigError(
                f"reward_model.path={str(path)!r}: no model folder (config.json) there; `nemo-azr train-rm` "
                "writes one"
            )
        if dtype not in DTYPES:
            raise ConfigError(f"reward_model.dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        labels = AutoConfig.from_pretrained(folder).num_labels
        if labels != 1:
            raise ConfigError(
                f"reward_model.path={str(path)!r} has {labels} labels; a reward model scores with one"
            )
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"reward_model.path={str(path)!r}: no tokenizer there ({exc})") from None
        self.model = AutoModelForSequenceClassification.from_pretrained(
            folder, dtype=DTYPES[dtype], local_files_only=True
        )
        self.model.to(device).eval().requires_grad_(False)
        self.device = torch.device(device)
        self.batch_size = max(1, batch_size)
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.tokenizer.eos_token_id

    @torch.no_grad()
    def score(self, messages: Sequence[list[dict]], replies: Sequence[str]) -> torch.Tensor:
        """``[len(replies)]`` float32 scores on the CPU."""
        rows = [reward_model_input(self.tokenizer, m, r) for m, r in zip(messages, replies, strict=True)]
        scores = []
        for start in range(0, len(rows), self.batch_size):
            ids, mask = right_padded(rows[start : start + self.batch_size], self.pad_id)
            scores.append(last_token_scores(self.model, ids.to(self.device), mask.to(self.device)).cpu())
        return torch.cat(scores) if scores else torch.zeros(0)

    @torch.no_grad()
    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, T]`` float32 scores on the CPU at every position of rows already in the policy's
        tokens (the batch's ``[left-padded prompt | right-padded response]``), padding scored 0."""
        from nemo_azr.contracts.assemble import position_ids_from_mask

        out = []
        for start in range(0, len(input_ids), self.batch_size):
            ids = input_ids[start : start + self.batch_size].to(self.device)
            mask = attention_mask[start : start + self.batch_size].to(self.device)
            scores = every_token_scores(self.model, ids, mask, position_ids_from_mask(mask))
            out.append((scores * mask).cpu())
        return torch.cat(out) if out else torch.zeros(0, input_ids.shape[-1])
