"""Generic checks of a composed config: helpers every component's check uses, and the sections that
need no component to judge (numbers in range, fixed choices of the config's own keys).

Each failure is a :class:`ConfigError` naming the key, the value and what would be valid. The checks
that need a component (a registered name, an estimator's needs, an environment's keys) live beside
the component; ``nemo_azr.preflight`` runs them all.
"""

from __future__ import annotations

import dataclasses
import math

from nemo_azr.config.schema import EvalConfig, OptimConfig
from nemo_azr.errors import ConfigError

SCHEDULES = ("constant", "linear", "cosine")
DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")
DEMONSTRATION_ROLES = ("user", "assistant")


def require(cond: bool, message: str) -> None:
    """Raise ``ConfigError(message)`` unless ``cond``."""
    if not cond:
        raise ConfigError(message)


def one_of(key: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    require(value in allowed, f"{key}={value!r} is not one of: {', '.join(allowed)}")


def reject_nonfinite(node: object, prefix: str = "") -> None:
    """No numeric setting may be inf/nan: ``optim.lr=inf`` passes a ``> 0`` check and would turn every
    weight into nan at the first step. (``extra`` is the user's own and is not checked.)"""
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            reject_nonfinite(value, f"{key}.")
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            require(not isinstance(v, float) or math.isfinite(v), f"{key}={value} is not a finite number")


def check_optim(prefix: str, opt: OptimConfig) -> None:
    one_of(f"{prefix}.schedule", opt.schedule, SCHEDULES)
    require(opt.lr > 0, f"{prefix}.lr must be > 0, got {opt.lr}")
    require(
        len(opt.betas) == 2 and all(0 <= b < 1 for b in opt.betas),
        f"{prefix}.betas must be two values in [0, 1), got {opt.betas}",
    )
    require(opt.grad_clip >= 0, f"{prefix}.grad_clip must be >= 0 (0 disables)")
    require(opt.warmup_steps >= 0 and opt.total_steps >= 0, f"{prefix}.warmup_steps/total_steps must be >= 0")
    require(0 <= opt.min_lr_ratio <= 1, f"{prefix}.min_lr_ratio must be in [0, 1]")


def check_demonstrations(demos: list) -> None:
    """Alternating user/assistant messages, starting with user and ending with assistant."""
    for i, message in enumerate(demos):
        expected = DEMONSTRATION_ROLES[i % 2]
        require(
            isinstance(message, dict) and set(message) == {"role", "content"},
            f"data.demonstrations[{i}] must be {{role: ..., content: ...}}, got {message!r}",
        )
        require(
            message["role"] == expected,
            f"data.demonstrations[{i}].role is {message['role']!r}, expected {expected!r} "
            "(exchanges alternate user, assistant)",
        )
        require(
            isinstance(message["content"], str) and bool(message["content"].strip()),
            f"data.demonstrations[{i}].content must be a non-empty string",
        )
    require(
        len(demos) % 2 == 0,
        "data.demonstrations must end with an assistant message (the demonstrated answer)",
    )


def check_eval(ev: EvalConfig) -> None:
    require(bool(ev.checkpoint), "eval.checkpoint must be auto, model or a checkpoint/model folder")
    require(ev.num_examples >= 0, f"eval.num_examples must be >= 0 (0 = all), got {ev.num_examples}")
    require(
        ev.answers_per_prompt >= 1 and ev.confidences_per_answer >= 1,
        "eval.answers_per_prompt and eval.confidences_per_answer must be >= 1",
    )
    require(ev.prompts_per_batch >= 1, f"eval.prompts_per_batch must be >= 1, got {ev.prompts_per_batch}")
    require(ev.n_bins >= 1, f"eval.n_bins must be >= 1, got {ev.n_bins}")
