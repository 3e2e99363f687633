"""The reward model in a process of its own (``reward_model.placement=process``).

A reward model as large as the policy doubles the trainer's memory and shares its threads (and, on
a GPU, its device). In its own process it keeps its weights, caches and allocator apart, may sit on
another device (``reward_model.device``), and a crash in it ends the run with one line naming it
rather than taking the trainer's memory down with it. The scores are the same as in the trainer's
process: the same :class:`~nemo_azr.rewards.reward_model.RewardModel` runs in the child.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import torch

from nemo_azr.config.schema import RewardModelConfig
from nemo_azr.contracts.capabilities import RewardScorer
from nemo_azr.errors import ConfigError
from nemo_azr.rewards.reward_model import RewardModel
from nemo_azr.utils.served_process import ServedProcess

__all__ = ["RewardModelProcess", "RewardModelProcessError", "build_reward_scorer"]


class RewardModelProcessError(RuntimeError):
    """The reward-model process failed or exited; the message carries its traceback or exit code."""


class _Score:
    """The child's handler: the reward model, built once, scoring each call."""

    def __init__(self, path: str, device: str, dtype: str, batch_size: int) -> None:
        self.model = RewardModel(path, device=device, dtype=dtype, batch_size=batch_size)

    def __call__(self, method: str, *args):
        if method not in ("score", "token_scores"):
            raise ValueError(f"reward model process: no method {method!r}")
        return getattr(self.model, method)(*args)


class RewardModelProcess:
    """A :class:`RewardModel` in a spawned child: ``score`` sends the texts and gets the scores."""

    def __init__(
        self,
        path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: int = 16,
        num_threads: int = 0,
    ) -> None:
        self._child = ServedProcess(
            partial(_Score, str(path), str(device), dtype, batch_size),
            what="reward model",
            error=RewardModelProcessError,
            passthrough=(ConfigError,),
            num_threads=num_threads,
        )
        weakref.finalize(self, self._child.shutdown)  # the trainer may be dropped without a close

    def score(self, messages: Sequence[list[dict]], replies: Sequence[str]) -> torch.Tensor:
        return self._child.call("score", list(messages), list(replies))

    def token_scores(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._child.call("token_scores", input_ids, attention_mask)

    def close(self) -> None:
        self._child.shutdown()


def build_reward_scorer(
    cfg: RewardModelConfig, trainer_device: torch.device | str, policy_tokenizer=None
) -> RewardScorer | None:
    """The scorer ``reward_model.*`` asks for: none without a path, else the model in the trainer's
    process or in its own, on ``reward_model.device`` (default: the trainer's). Per-token scoring
    reads the policy's token ids, so it needs ``policy_tokenizer``'s vocabulary."""
    if not cfg.path:
        return None
    if cfg.per_token:
        check_same_vocabulary(cfg.path, policy_tokenizer)
    device = cfg.device or str(trainer_device)
    if cfg.placement == "process":
        return RewardModelProcess(
            cfg.path, device=device, dtype=cfg.dtype, batch_size=cfg.batch_size, num_threads=cfg.num_threads
        )
    return RewardModel(cfg.path, device=device, dtype=cfg.dtype, batch_size=cfg.batch_size)


def check_same_vocabulary(path: str | Path, policy_tokenizer) -> None:
    """Per-token scores are read on the policy's own token ids: the reward model must share its
    vocabulary (one ``train-rm`` trained from the policy's base does)."""
    from transformers import AutoTokenizer

    try:
        mine = AutoTokenizer.from_pretrained(Path(path).expanduser()).get_vocab()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"reward_model.path={str(path)!r}: no tokenizer there ({exc})") from None
    if policy_tokenizer is None or mine != policy_tokenizer.get_vocab():
        raise ConfigError(
            f"reward_model.per_token=true scores the policy's own tokens, but reward_model.path={str(path)!r} "
            "has another vocabulary; train the reward model from the policy's base (nemo-azr train-rm "
            "model=...) or set reward_model.per_token=false"
        )
