"""The locally built tiny model and tokenizer: round trips, chat template, caching, atomicity."""

from __future__ import annotations

import dataclasses
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_azr.config.schema import TinyModelConfig
from nemo_azr.errors import ConfigError
from nemo_azr.models import tiny
from nemo_azr.models.tiny import ensure_tiny_model, resolve_model_path, tiny_model_dir
from nemo_azr.models.tokenizer_build import load_tokenizer

ROUND_TRIP_TEXTS = [
    "What is 3 + 5?",
    "8",
    "  leading and trailing spaces  ",
    "line one\nline two\n\n\tindented\r\nwindows",
    "<think> step by step </think>\n<answer>-12</answer>",
    "<analysis>x</analysis><confidence>0.75</confidence>",
    '{"instruction": "do it", "harm_action": null, "questions": ["a?", "b?"]}',
    "def f(x):\n    return x ** 2 + 1\n\nprint(f(3))  # 10",
    "$ ls -la /tmp && echo 'done' | grep -v x",
    "café naïve 日本語 😀 π≈3.14159 — “quotes”",
    "a . b , c ! ' s 'LL",
    "<|im_start|>user\nhi<|im_end|>\n",
    "",
]

FAMILIES = ["llama", "qwen2"]


def _cfg(cache: Path, **overrides) -> TinyModelConfig:
    return TinyModelConfig(cache_dir=str(cache), **overrides)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny_cache")


@pytest.fixture(scope="module")
def built(cache: Path) -> dict[str, Path]:
    """Each family built once for the whole module."""
    return {family: ensure_tiny_model(_cfg(cache, family=family)) for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_through_auto_tokenizer(built: dict[str, Path], family: str) -> None:
    folder = built[family]
    assert (folder / "config.json").is_file()  # the loader sees the model type, as in real use
    for tokenizer in (AutoTokenizer.from_pretrained(folder), load_tokenizer(folder)):
        for text in ROUND_TRIP_TEXTS:
            ids = tokenizer.encode(text, add_special_tokens=False)
            assert tokenizer.decode(ids) == text, (type(tokenizer).__name__, text)


@pytest.mark.parametrize("family", FAMILIES)
def test_auto_tokenizer_and_load_tokenizer_agree(built: dict[str, Path], family: str) -> None:
    auto, ours = AutoTokenizer.from_pretrained(built[family]), load_tokenizer(built[family])
    for text in ROUND_TRIP_TEXTS:
        assert auto.encode(text) == ours.encode(text)


def test_load_tokenizer_keeps_non_nfc_text_exactly(built: dict[str, Path]) -> None:
    text = unicodedata.normalize("NFD", "café Å")
    for folder in built.values():
        tokenizer = load_tokenizer(folder)
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_any_bytes_encode_without_unknown(built: dict[str, Path]) -> None:
    tokenizer = load_tokenizer(built["llama"])
    text = "".join(chr(c) for c in range(1, 400)) + "\U0001f680\u200b"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.unk_token is None


def test_chat_template(built: dict[str, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(built["llama"])
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 5?"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 3 + 5?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_prompt = tokenizer.apply_chat_template(messages[1:], add_generation_prompt=False, tokenize=False)
    assert no_prompt == "<|im_start|>user\nWhat is 3 + 5?<|im_end|>\n"


@pytest.mark.parametrize("family", FAMILIES)
def test_special_token_ids(built: dict[str, Path], family: str) -> None:
    tokenizer = load_tokenizer(built[family])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token == "<|pad|>" and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.bos_token is None
    # special tokens are single ids and not split by BPE
    assert tokenizer.encode("<|im_start|>") == [tokenizer.convert_tokens_to_ids("<|im_start|>")]
    model = AutoModelForCausalLM.from_pretrained(built[family])
    assert model.config.eos_token_id == im_end
    assert model.config.pad_token_id == tokenizer.pad_token_id
    assert model.generation_config.eos_token_id == im_end
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


@pytest.mark.parametrize("family", FAMILIES)
def test_model_loads_and_gives_logits(built: dict[str, Path], family: str) -> None:
    folder = built[family]
    tokenizer = load_tokenizer(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.model_type == family
    assert (folder / "model.safetensors").is_file()
    ids = tokenizer("What is 3 + 5?", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


def test_same_config_reuses_folder(cache: Path, built: dict[str, Path], monkeypatch) -> None:
    cfg = _cfg(cache, family="llama")
    weights = built["llama"] / "model.safetensors"
    mtime = weights.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("rebuilt a cached tiny model")

    monkeypatch.setattr(tiny, "_build", fail)
    assert ensure_tiny_model(cfg) == built["llama"]
    assert weights.stat().st_mtime_ns == mtime
    # cache_dir is not part of the key; a weight-changing field is
    assert tiny_model_dir(dataclasses.replace(cfg, cache_dir=str(cache / "x"))).name == built["llama"].name
    assert tiny_model_dir(dataclasses.replace(cfg, seed=1)) != built["llama"]
    assert tiny_model_dir(dataclasses.replace(cfg, hidden_size=64)) != built["llama"]


def test_build_is_deterministic(tmp_path: Path, built: dict[str, Path]) -> None:
    again = ensure_tiny_model(_cfg(tmp_path, family="llama"))
    for name in ("model.safetensors", "tokenizer.json"):
        assert (again / name).read_bytes() == (built["llama"] / name).read_bytes()


def test_seed_changes_weights(tmp_path: Path, built: dict[str, Path]) -> None:
    other = ensure_tiny_model(_cfg(tmp_path, family="llama", seed=7))
    a = AutoModelForCausalLM.from_pretrained(built["llama"]).model.embed_tokens.weight
    b = AutoModelForCausalLM.from_pretrained(other).model.embed_tokens.weight
    assert not torch.equal(a, b)


def test_build_does_not_disturb_global_rng(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    ensure_tiny_model(_cfg(tmp_path, family="llama", seed=5, hidden_size=32, intermediate_size=64))
    assert torch.equal(torch.rand(3), expected)


def test_vocab_padding(tmp_path: Path, built: dict[str, Path]) -> None:
    tokenizer_size = len(load_tokenizer(built["llama"]))
    padded_size = tokenizer_size + 37
    folder = ensure_tiny_model(_cfg(tmp_path, family="llama", vocab_size=padded_size))
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.vocab_size == padded_size
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.shape[-1] == padded_size
    assert len(load_tokenizer(folder)) == tokenizer_size  # the tokenizer itself is unchanged
    # a smaller cfg.vocab_size never truncates the tokenizer's vocabulary
    small = ensure_tiny_model(_cfg(tmp_path, family="llama", vocab_size=10))
    assert AutoModelForCausalLM.from_pretrained(small).config.vocab_size == tokenizer_size


def test_half_built_folder_is_not_used(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, family="qwen2", hidden_size=32, intermediate_size=64)
    target = tiny_model_dir(cfg)
    target.parent.mkdir(parents=True, exist_ok=True)
    # a crashed build's leftovers: a temp folder, and a target without the completion marker
    leftover = target.parent / f"{tiny.TEMP_PREFIX}{target.name}-crashed"
    leftover.mkdir()
    (leftover / "config.json").write_text("{}")
    target.mkdir()
    (target / "config.json").write_text("{ truncated")

    folder = ensure_tiny_model(cfg)
    assert folder == target
    assert (folder / tiny.MARKER_FILE).is_file()
    assert AutoModelForCausalLM.from_pretrained(folder).config.hidden_size == 32
    assert not leftover.exists()


def test_failed_build_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    cfg = _cfg(tmp_path, family="llama", hidden_size=32, intermediate_size=64)

    def crash(cfg, folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(tiny, "_build", crash)
    with pytest.raises(RuntimeError):
        ensure_tiny_model(cfg)
    assert not tiny_model_dir(cfg).exists()
    assert not list(tmp_path.glob(f"{tiny.TEMP_PREFIX}*"))


def test_concurrent_callers_build_once(tmp_path: Path, monkeypatch) -> None:
    # flock locks belong to an open file description, so threads exclude each other like processes
    cfg = _cfg(tmp_path, family="llama", hidden_size=32, intermediate_size=64)
    real_build, calls = tiny._build, []

    def slow_build(cfg, folder):
        calls.append(folder)
        time.sleep(0.2)  # long enough that the second caller arrives mid-build
        real_build(cfg, folder)

    monkeypatch.setattr(tiny, "_build", slow_build)
    with ThreadPoolExecutor(max_workers=2) as pool:
        folders = list(pool.map(lambda _: ensure_tiny_model(cfg), range(2)))
    assert folders[0] == folders[1] == tiny_model_dir(cfg)
    assert len(calls) == 1


def test_cache_root_from_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NEMO_AZR_CACHE", str(tmp_path / "env_cache"))
    assert tiny_model_dir(TinyModelConfig()).parent == (tmp_path / "env_cache").resolve()


@pytest.mark.parametrize(
    "overrides",
    [{"family": "gpt9"}, {"hidden_size": 130}, {"num_kv_heads": 3}, {"num_layers": 0}, {"vocab_size": -1}],
)
def test_bad_config_is_a_config_error(tmp_path: Path, overrides: dict) -> None:
    with pytest.raises(ConfigError):
        tiny_model_dir(_cfg(tmp_path, **overrides))


def test_resolve_model_path(cache: Path, built: dict[str, Path], tmp_path: Path) -> None:
    assert resolve_model_path("tiny", _cfg(cache, family="llama")) == built["llama"]
    assert resolve_model_path(str(built["qwen2"]), TinyModelConfig()) == built["qwen2"]
    with pytest.raises(ConfigError, match="never downloads"):
        resolve_model_path("Qwen/Qwen2.5-0.5B", TinyModelConfig())
    with pytest.raises(ConfigError, match="config.json missing"):
        resolve_model_path(str(tmp_path), TinyModelConfig())


def test_load_tokenizer_bad_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ConfigError):
        load_tokenizer(tmp_path)  # exists, but holds no tokenizer
