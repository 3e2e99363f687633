"""Compose the Hydra config, turn every config problem into one clear line, validate semantics.

We use Hydra's compose API (not ``@hydra.main``) so the CLI owns error reporting: a wrong key,
a wrong type or an unknown group option becomes a :class:`ConfigError` with a one-line message
instead of Hydra's multi-line report.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, ListConfig, OmegaConf

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.errors import ConfigError

SCHEMA_NAME = "nemo_azr_schema"
DEFAULT_CONFIG_NAME = "config"
_MAX_PARTS = 2  # the outer message says where, the first cause says what; deeper ones repeat them


def config_dir() -> Path:
    """The ``conf/`` folder (top level of the repo; installed as ``nemo_azr/conf``: setup.py maps it)."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "conf", here.parent / "conf"):
        if (candidate / f"{DEFAULT_CONFIG_NAME}.yaml").is_file():
            return candidate
    raise ConfigError(f"cannot find the conf/ folder next to {here}; reinstall the package")


def _register_schema() -> None:
    ConfigStore.instance().store(name=SCHEMA_NAME, node=NemoAzrConfig)


def config_groups() -> dict[str, list[str]]:
    """Every config group (``conf/<group>/``) and its options, as ``group=option`` picks them."""
    root = config_dir()
    return {
        group.name: sorted(f.stem for f in group.glob("*.yaml"))
        for group in sorted(root.iterdir())
        if group.is_dir() and any(group.glob("*.yaml"))
    }


def config_groups_help() -> str:
    """The groups and options for ``--help``, with where the single keys are listed."""
    lines = ["config groups (pick one with GROUP=OPTION):"]
    lines += [f"  {group}: {', '.join(options)}" for group, options in config_groups().items()]
    lines += [
        "",
        "single keys: KEY=VALUE (e.g. trainer.max_steps=50); every key with its default and meaning is",
        "in docs/config.md; `nemo-azr show-config [overrides]` prints the composed config.",
    ]
    return "\n".join(lines)


def _one_line(exc: BaseException) -> str:
    """Hydra/OmegaConf errors span several lines and nest causes; keep the informative parts."""
    parts: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        text = re.sub(r"\s*(Set the environment variable HYDRA_FULL_ERROR=1|Config search path:).*", "", text)
        text = re.sub(r"\s*reference_type=\S+", "", text)
        if text and "$VALUE" not in text and not any(text in p for p in parts):
            parts.append(text)
        exc = exc.__cause__ or exc.__context__
    return " | ".join(parts[:_MAX_PARTS]) or "invalid configuration"


def compose_config(
    overrides: list[str] | None = None, *, config_name: str = DEFAULT_CONFIG_NAME
) -> DictConfig:
    """The composed (still structured) config for ``overrides`` like ``["trainer.max_steps=5"]``."""
    _register_schema()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base=None):
            cfg = compose(config_name=config_name, overrides=list(overrides or []))
    except ConfigError:
        raise
    except Exception as exc:  # Hydra raises many types; all mean "bad config"
        raise ConfigError(_misspelled_key(exc) or _one_line(exc)) from None
    finally:
        GlobalHydra.instance().clear()
    _reject_unknown_keys(cfg)
    return cfg


_OVERRIDE_RE = re.compile(r"Could not override '([^']+)'")


def _misspelled_key(exc: BaseException) -> str | None:
    """For an override of a key the schema lacks (``trainer.max_stesp=5``), the closest real key
    instead of Hydra's advice to append it with ``+``."""
    m = _OVERRIDE_RE.search(str(exc))
    if m is None:
        return None
    path = m.group(1)
    node: Any = NemoAzrConfig
    walked: list[str] = []
    for part in path.split("."):
        if not dataclasses.is_dataclass(node):
            return None  # a free-form dict (extra, ...): Hydra's message stands
        fields = {f.name: f for f in dataclasses.fields(node)}
        if part not in fields:
            close = difflib.get_close_matches(part, sorted(fields), n=1)
            where = ".".join(walked)
            hint = f"did you mean {where + '.' if where else ''}{close[0]}?" if close else "no such key."
            return f"unknown config key {path!r}: {hint} Every key is in docs/config.md"
        walked.append(part)
        node = _field_type(fields[part])
    return None


def _field_type(f: dataclasses.Field) -> Any:
    """The dataclass a field holds (its default factory's class), else None."""
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        return type(value) if dataclasses.is_dataclass(value) else None
    return type(f.default) if dataclasses.is_dataclass(f.default) else None


def _reject_unknown_keys(node: DictConfig | ListConfig, prefix: str = "") -> None:
    """A ``+key=value`` override adds keys that the dataclass conversion then drops without a word:
    ``+trainer.max_step=5`` (a typo) would train with the default. Only the free-form dict keys
    (``extra``, ``generation.backend_kwargs``, ...) accept new names."""
    if isinstance(node, ListConfig):
        for i, item in enumerate(node._iter_ex(resolve=False)):
            if isinstance(item, DictConfig | ListConfig):
                _reject_unknown_keys(item, f"{prefix}[{i}]")
        return
    schema = OmegaConf.get_type(node)
    known = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    for key in node:
        path = f"{prefix}.{key}" if prefix else str(key)
        if known is not None and key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1)
            hint = (
                f"did you mean {prefix + '.' if prefix else ''}{close[0]}?"
                if close
                else f"settings of your own go under extra (+extra.{key}=...)"
            )
            raise ConfigError(f"unknown config key {path!r}: {hint} Every key is in docs/config.md")
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig) and not child._is_missing() and not child._is_none():
            _reject_unknown_keys(child, path)


def build_config(
    overrides: list[str] | None = None, *, config_name: str = DEFAULT_CONFIG_NAME
) -> NemoAzrConfig:
    """Compose and convert to the dataclass tree (types and key names checked; the semantic checks
    are ``nemo_azr.preflight.load_config``'s). Raises ConfigError on any problem."""
    composed = compose_config(overrides, config_name=config_name)
    try:
        return OmegaConf.to_object(composed)
    except Exception as exc:
        raise ConfigError(_one_line(exc)) from None


def to_yaml(cfg: NemoAzrConfig | DictConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg) if not isinstance(cfg, DictConfig) else cfg)


def config_from_yaml(text: str) -> NemoAzrConfig:
    """Rebuild a config saved with :func:`to_yaml` (checkpoints store the resolved config)."""
    base = OmegaConf.structured(NemoAzrConfig)
    try:
        merged = OmegaConf.merge(base, OmegaConf.create(text))
        return OmegaConf.to_object(merged)
    except Exception as exc:
        raise ConfigError(_one_line(exc)) from None
