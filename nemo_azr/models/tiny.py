"""The built-in tiny model: a small llama/qwen2 made locally from a config and cached on disk.

Nothing is downloaded. The folder is an ordinary HF model folder (config.json, safetensors,
tokenizer files), so the rest of the trainer loads it exactly like a real checkpoint. It is built
into a temporary folder and renamed into place when complete, under a file lock, so concurrent
processes build it once and a crash mid-build never leaves a folder that counts.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from nemo_azr.config.schema import TinyModelConfig
from nemo_azr.errors import ConfigError
from nemo_azr.models.hf.cache import CACHE_ENV_VAR, DEFAULT_CACHE_ROOT, file_lock
from nemo_azr.models.importer import PRESETS, ensure_preset
from nemo_azr.models.tokenizer_build import (
    EOS_TOKEN,
    PAD_TOKEN,
    build_hf_tokenizer,
    generate_corpus,
    load_tokenizer,
    save_tokenizer,
)

__all__ = ["ensure_tiny_model", "load_tokenizer", "resolve_model_path", "tiny_model_dir"]

TINY_MODEL_PATH = "tiny"  # the model.path value that selects the built-in model
# Bump when the tokenizer corpus or the build recipe changes, so stale caches are not reused.
BUILD_VERSION = 1
HASH_CHARS = 12
MARKER_FILE = "nemo_azr_tiny.json"  # written last: a folder without it is not a finished build
TEMP_PREFIX = ".tmp-"
INITIALIZER_RANGE = 0.02

_FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
}
# Fields that do not change the weights or the tokenizer stay out of the cache key.
_NON_KEY_FIELDS = {"cache_dir"}


def _cache_root(cfg: TinyModelConfig) -> Path:
    root = cfg.cache_dir or os.environ.get(CACHE_ENV_VAR) or str(DEFAULT_CACHE_ROOT)
    return Path(root).expanduser().resolve()


@functools.cache
def corpus_digest() -> str:
    """Hash of the tokenizer's training corpus: a change of any template it draws from (e.g. a
    self-play domain's) gives a new cache folder instead of silently reusing a stale tokenizer."""
    return hashlib.sha256("\n".join(generate_corpus()).encode()).hexdigest()[:HASH_CHARS]


def _cache_key(cfg: TinyModelConfig) -> str:
    fields = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NON_KEY_FIELDS}
    fields["build_version"] = BUILD_VERSION
    fields["corpus"] = corpus_digest()
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:HASH_CHARS]


def _validate(cfg: TinyModelConfig) -> None:
    if cfg.family not in _FAMILIES:
        raise ConfigError(f"model.tiny.family {cfg.family!r} is unknown; known: {', '.join(_FAMILIES)}")
    positive = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
    for name in (*positive, "max_position_embeddings"):
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"model.tiny.{name} must be > 0, got {getattr(cfg, name)}")
    if cfg.hidden_size % cfg.num_heads:
        raise ConfigError(
            f"model.tiny.hidden_size ({cfg.hidden_size}) must be divisible by num_heads ({cfg.num_heads})"
        )
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"model.tiny.num_heads ({cfg.num_heads}) must be divisible by num_kv_heads ({cfg.num_kv_heads})"
        )
    if cfg.vocab_size < 0:
        raise ConfigError(f"model.tiny.vocab_size must be >= 0, got {cfg.vocab_size}")


def tiny_model_dir(cfg: TinyModelConfig) -> Path:
    """The cache folder for ``cfg``: ``<cache_root>/tiny-<family>-<hash of the weight fields>``."""
    _validate(cfg)
    return _cache_root(cfg) / f"tiny-{cfg.family}-{_cache_key(cfg)}"


def _is_complete(folder: Path) -> bool:
    return (folder / MARKER_FILE).is_file()


def ensure_tiny_model(cfg: TinyModelConfig) -> Path:
    """Return the tiny model's folder, building it first if no finished build is cached."""
    target = tiny_model_dir(cfg)
    if _is_complete(target):
        return target
    root = target.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the tiny-model cache folder {str(root)!r}: {exc}") from exc
    with file_lock(root / f".{target.name}.lock"):
        if _is_complete(target):  # another process finished it while we waited
            return target
        # We hold the lock, so any temp folder for this key is a dead build's leftover.
        for stale in root.glob(f"{TEMP_PREFIX}{target.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # a finished-looking folder without the marker: not ours to trust
            shutil.rmtree(target)
        temp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{target.name}-", dir=root))
        try:
            _build(cfg, temp)
            os.rename(temp, target)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
    return target


def _build(cfg: TinyModelConfig, folder: Path) -> None:
    """Write tokenizer, config, generation config and seeded weights into ``folder``."""
    tokenizer = build_hf_tokenizer(model_max_length=cfg.max_position_embeddings)
    save_tokenizer(tokenizer, folder)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)

    config_cls, model_cls = _FAMILIES[cfg.family]
    config = config_cls(
        vocab_size=max(len(tokenizer), cfg.vocab_size),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        initializer_range=INITIALIZER_RANGE,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # fork_rng: seeding for a deterministic init must not disturb the caller's RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model: PreTrainedModel = model_cls(config)
    model.generation_config = GenerationConfig(bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(str(folder))

    marker = {"tiny": dataclasses.asdict(cfg), "build_version": BUILD_VERSION}
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def resolve_model_path(path: str, tiny: TinyModelConfig) -> Path:
    """``"tiny"`` -> the built-in tiny model (built if needed); a preset name (``smollm2-135m``) -> its
    imported folder (imported if needed); otherwise a local HF model folder or
    a megatron checkpoint folder (``dist/`` + ``model/``: a trainer checkpoint or ``nemo-azr convert``)."""
    if path == TINY_MODEL_PATH:
        return ensure_tiny_model(tiny)
    if path in PRESETS:  # a named real model (nemo-azr import-model), imported on first use
        return ensure_preset(path)
    folder = Path(path).expanduser()
    if (folder / "dist").is_dir() and (folder / "model" / "config.json").is_file():
        return folder.resolve()  # a megatron checkpoint (model.backend=megatron reads dist/)
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"model.path {path!r} is not a local HF model folder (config.json missing); "
            "this trainer never downloads from a hub"
        )
    return folder.resolve()
