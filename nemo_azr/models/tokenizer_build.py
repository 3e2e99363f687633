"""A small byte-level BPE tokenizer trained locally on generated text (no hub, no downloads).

The corpus covers what the trainer's tasks and environments put in front of the model: arithmetic
questions and answers, chat markers, reasoning/answer/confidence tags, JSON, short Python, shell
commands and plain English. The byte-level alphabet is always in the vocabulary, so any text (any
unicode) encodes without an unknown token and decodes back exactly.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from nemo_azr.errors import ConfigError

ENDOFTEXT_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
IM_END_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [ENDOFTEXT_TOKEN, IM_START_TOKEN, IM_END_TOKEN, PAD_TOKEN]
EOS_TOKEN = IM_END_TOKEN  # generation stops at the end of an assistant turn

TOKENIZER_VOCAB_SIZE = 1000
CORPUS_SEED = 1234
CORPUS_LINES_PER_KIND = 400  # ~5.5k lines over 7 kinds; trains in ~0.1 s
BPE_MIN_FREQUENCY = 2
SELFPLAY_CORPUS_GROUPS = 120  # templated question groups per self-play domain
SELFPLAY_CORPUS_SOLVED_GROUPS = 8  # of which turned into solver prompts and turns

# Qwen2's pre-tokenizer split (single digits, punctuation runs, newlines). transformers 5.x loads
# any qwen2-type folder with Qwen2Tokenizer, which rebuilds its pre-tokenizer with exactly this
# regex (plus NFC); training with it makes both classes produce the same ids.
PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
GENERIC_TOKENIZER_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")

# ChatML (Qwen style); the trailing newline after <|im_end|> separates turns.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_TAGS = ["think", "answer", "analysis", "confidence"]
_WORD_TEXT = (
    "the a an of to and in is it that for on with as was be by this are or at from have not "
    "model answer question reason step first then so because therefore result number sum product "
    "difference value input output function program code test check correct wrong confidence "
    "probably certain think about solve problem compute write return print list string integer "
    "user assistant system please help explain why how what which when where who yes no true false"
)
_WORDS = _WORD_TEXT.split()
_NAMES = ["f", "g", "solve", "add", "mul", "count", "reverse", "square", "total", "pick"]
_SHELL = [
    "ls -la",
    "cd /tmp",
    "cat file.txt",
    "echo hello",
    "grep -r foo .",
    "python main.py",
    "rm -rf build",
    "mkdir -p out",
    "pip install numpy",
    "git status",
    "wc -l data.jsonl",
]
_UNICODE = ["café", "naïve", "über", "π ≈ 3.14", "x² + y²", "→", "…", "—", "日本語", "😀", "°C", "±1"]


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 12))]
    return " ".join(words).capitalize() + rng.choice([".", "?", "!", ","])


def _arithmetic(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        op = rng.choice("+-*")
        result = a + b if op == "+" else a - b if op == "-" else a * b
        yield f"What is {a} {op} {b}?"
        yield str(result)
        yield f"{a} {op} {b} = {result}"


def _chat(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND):
        a, b = rng.randint(0, 20), rng.randint(0, 20)
        yield (
            f"{IM_START_TOKEN}system\nYou are a helpful assistant.{IM_END_TOKEN}\n"
            f"{IM_START_TOKEN}user\nWhat is {a} + {b}?{IM_END_TOKEN}\n"
            f"{IM_START_TOKEN}assistant\n{a + b}{IM_END_TOKEN}\n{ENDOFTEXT_TOKEN}"
        )


def _tags(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND):
        tag = rng.choice(_TAGS)
        body = f"{rng.random():.2f}" if tag == "confidence" else _sentence(rng)
        yield f"<{tag}> {body} </{tag}>"
        yield f"<think>{_sentence(rng)}</think>\n<answer>{rng.randint(-50, 200)}</answer>"
        yield f"<analysis>{_sentence(rng)}</analysis> <confidence>{rng.random():.1f}</confidence>"


def _json(rng: random.Random) -> Iterator[str]:
    keys = ["instruction", "harm_action", "questions", "question", "answer", "id", "input", "output"]
    for i in range(CORPUS_LINES_PER_KIND):
        obj = {rng.choice(keys): _sentence(rng) for _ in range(rng.randint(1, 3))}
        if rng.random() < 0.3:
            obj["questions"] = [_sentence(rng) for _ in range(2)]
        obj["id"] = i
        yield json.dumps(obj, ensure_ascii=rng.random() < 0.5)


def _python(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND):
        name, k = rng.choice(_NAMES), rng.randint(1, 9)
        yield f"def {name}(x):\n    return x * {k} + {rng.randint(0, 9)}"
        yield f"def {name}(xs):\n    for i in range(len(xs)):\n        xs[i] += {k}\n    return xs"
        yield f"assert {name}({k}) == {k * k}\nprint({name}([1, 2, 3]))"
        yield f"Input: {rng.randint(0, 99)}\nOutput: {rng.randint(0, 99)}"


def _shell(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND // 2):
        yield f"$ {rng.choice(_SHELL)} && {rng.choice(_SHELL)}"


def _english(rng: random.Random) -> Iterator[str]:
    for _ in range(CORPUS_LINES_PER_KIND):
        yield " ".join(_sentence(rng) for _ in range(rng.randint(1, 3)))
        if rng.random() < 0.2:
            yield f"{_sentence(rng)} {rng.choice(_UNICODE)}\t{rng.choice(_UNICODE)}"


def _selfplay(rng: random.Random) -> Iterator[str]:
    """The self-play environments' own texts (proposer prompts, templated question groups, solver
    prompts and turns), so their JSON keys, actions and code get merges of their own and a whole
    question group fits the tiny model's context. Drawn from the domains' templates: the corpus
    hash in the tiny model's cache key makes any template change rebuild the tokenizer."""
    from nemo_azr.envs.python_exec import PythonExecDomain
    from nemo_azr.envs.sandbox_os import SandboxOSDomain

    for domain in (SandboxOSDomain(), PythonExecDomain()):
        seeds = domain.seed_tasks()
        yield domain.solver_system_prompt()
        for i in range(SELFPLAY_CORPUS_GROUPS):
            seed_task = seeds[i % len(seeds)]
            k = 1 + i % 3
            yield domain.proposer_messages(seed_task, k)[-1]["content"]
            text = domain.warmup_proposal(seed_task, k, rng)
            yield text
            # Solver-side texts need a parsed group, which python_exec checks by running the
            # programs (~0.1 s a group): a few groups give the shapes at a small cost.
            if i < SELFPLAY_CORPUS_SOLVED_GROUPS:
                for question in domain.parse_proposal(text, seed_task, k):
                    yield domain.make_env().reset(question)
                    for _ in range(4):
                        yield domain.warmup_solution(question, rng)


def generate_corpus(seed: int = CORPUS_SEED) -> list[str]:
    """The training text: a few thousand deterministic lines (same seed -> same corpus)."""
    rng = random.Random(seed)
    lines: list[str] = []
    for kind in (_arithmetic, _chat, _tags, _json, _python, _shell, _english, _selfplay):
        lines.extend(kind(rng))
    return lines


def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB_SIZE, seed: int = CORPUS_SEED) -> Tokenizer:
    """Train a byte-level BPE ``tokenizers.Tokenizer`` on :func:`generate_corpus`."""
    tokenizer = Tokenizer(models.BPE())
    # No normalizer: any normalization (NFC, lowercasing) would break the exact round trip.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=BPE_MIN_FREQUENCY,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(generate_corpus(seed), trainer=trainer)
    return tokenizer


def build_hf_tokenizer(model_max_length: int) -> PreTrainedTokenizerFast:
    """The trained tokenizer wrapped for transformers, with special tokens and the chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_tokenizer(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # it would turn "a ." into "a." on decode
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [ENDOFTEXT_TOKEN, IM_START_TOKEN]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Save, forcing the generic fast class so AutoTokenizer never swaps in a model-specific one.

    transformers 5.x maps some model types (qwen2) to a tokenizer class that rebuilds the
    pre-tokenizer from scratch and drops spaces; naming the generic class avoids that.
    """
    tokenizer.save_pretrained(str(directory))
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["clean_up_tokenization_spaces"] = False
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a local model folder (never from a hub).

    A folder that declares the generic fast class (ours do) is loaded with that class as saved:
    AutoTokenizer would swap in Qwen2Tokenizer for qwen2 folders, which adds NFC normalization.
    Other folders go through AutoTokenizer. A tokenizer without a pad token gets its eos token as
    pad (batched generation needs one). The padding side is left to callers.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(f"tokenizer folder {str(folder)!r} does not exist")
    try:
        if _declared_tokenizer_class(folder) in GENERIC_TOKENIZER_CLASSES:
            tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        else:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a tokenizer from {str(folder)!r}: {exc}") from exc
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _declared_tokenizer_class(folder: Path) -> str | None:
    config_path = folder / "tokenizer_config.json"
    try:
        return json.loads(config_path.read_text(encoding="utf-8")).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None  # no or unreadable config: let AutoTokenizer decide (and explain)
