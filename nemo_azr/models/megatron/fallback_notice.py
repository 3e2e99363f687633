"""One line instead of megatron-core's fallback warnings (and none for its checkpoints' deprecations).

Without TransformerEngine and Apex (every CPU machine, and GPU images without them) megatron-core
warns at import and at model build that it falls back to torch: about five warnings a rank, each
with its source line, so a 4-rank job's log starts with some forty lines that say one thing. They
are filtered here (by message, so any other megatron warning still shows) and the main process
says it once when it builds a model without TransformerEngine (:func:`announce_torch_fallbacks`).
"""

from __future__ import annotations

import sys
import warnings

import torch

#: the starts of megatron-core's "not installed, falling back" warnings
FALLBACK_WARNINGS = (
    r"Transformer Engine and Apex are not installed",
    r"Apex is not installed",
)
#: deprecations inside megatron-core's distributed checkpointing (its ShardedTensor and torch's
#: deprecated ``load_state_dict``), printed by every rank on every resume; nothing a user can change
CHECKPOINT_DEPRECATIONS = (
    r"Please use DTensor instead and we are deprecating ShardedTensor",
    r"`load_state_dict` is deprecated and will be removed in future versions",
)
#: a GPU tuning hint with no meaning where there is no GPU
CPU_ONLY_WARNINGS = (r"When using async grad allreduce it is recommended to set the environment variable",)
NOTICE = (
    "nemo-azr: megatron-core without TransformerEngine / Apex: torch's RMSNorm, SDPA attention and "
    "optimizers are used (parallel.use_te, docs/megatron.md)"
)

_announced = False


def filter_fallback_warnings() -> None:
    """Drop the fallback warnings, the checkpoint deprecations and, without CUDA, the GPU-only hints."""
    messages = FALLBACK_WARNINGS + (() if torch.cuda.is_available() else CPU_ONLY_WARNINGS)
    for message in messages:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)
    for message in CHECKPOINT_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def announce_torch_fallbacks(is_main: bool) -> None:
    """Say once, on the main process, that the model runs on torch's fallbacks."""
    global _announced
    if is_main and not _announced:
        print(NOTICE, file=sys.stderr, flush=True)
    _announced = True


filter_fallback_warnings()  # on import: nemo_azr.models.megatron imports this module first
