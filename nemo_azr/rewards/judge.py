"""The LLM judge behind ``*_evaluator_type: llm``: a rubric prompt per episode, a parsed score in [0, 1].

:class:`LLMJudge` renders each episode's chat history as a compact transcript, puts the rubric in
the system message, generates all replies with ONE batched greedy ``backend.generate`` call and
parses a score from each reply with :func:`parse_judge_score`. A reply without a usable score gets
``JudgeConfig.default_score`` and is counted, so a judge that cannot follow the format shows up in
the metrics instead of silently steering training.

:func:`build_judge` judges with the policy's own generation backend (``judge.model_path: ""``) or
loads a frozen judge (a local model folder or a preset name such as ``smollm2-135m``, never from a
hub) into the project's ``hf`` generation backend. ``judge.demonstrations`` are example exchanges
put between the rubric and the transcript (a small judge copies a shown reply format).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from nemo_azr.config.schema import JudgeConfig
from nemo_azr.contracts.generation import GenerationBackend, GenerationRequest, SamplingParams
from nemo_azr.errors import ConfigError
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.rollout.hf_backend import HFGenerationBackend
from nemo_azr.rollout.single_turn import encode_prompt

__all__ = [
    "DEFAULT_MAX_PROMPT_TOKENS",
    "PARSE_FAILURE_POLICIES",
    "JudgeScores",
    "LLMJudge",
    "build_judge",
    "check_judge_config",
    "parse_judge_score",
]

#: Judge prompt budget in tokens (the tiny model has 512 positions: 384 leaves room for the reply).
DEFAULT_MAX_PROMPT_TOKENS = 384
#: ``judge.on_parse_failure``: what stands in for a reply without a usable score.
PARSE_FAILURE_POLICIES = ("default", "rule")
TRUNCATION_MARKER = "[...]\n"  # put in front of a transcript whose beginning was cut

# A number, optionally a percentage ("80%") or a fraction ("8/10", "8 out of 10"). The lookahead
# keeps backtracking from reading "1.5" as "1" or "10" as "1".
_NUM = r"-?(?:\d+(?:\.\d+)?|\.\d+)(?!\.?\d)"
_VALUE = rf"(?<![\w.])(?P<num>{_NUM})(?:\s*(?P<pct>%)|\s*(?:/|out\s+of)\s*(?P<den>{_NUM}))?"
_VALUE_RE = re.compile(_VALUE, re.IGNORECASE)
# An echoed format line ("Score: <number between 0 and 1>") must not read as a score of 1.
_PLACEHOLDER_RE = re.compile(r"<[^<>\n]*[A-Za-z][^<>\n]*>")
# "Score: 0.8", "score=1", "**Score:** 8/10", "final score is 80%", "score of .9".
_KEYWORD_RE = re.compile(rf"\bscore\b\W{{0,6}}?(?:(?:is|of|was|=)\W{{0,6}}?)?{_VALUE}", re.IGNORECASE)


def parse_judge_score(text: str) -> float | None:
    """The score in a judge's reply, normalised to [0, 1], or None when there is no usable one.

    Accepted forms (case-insensitive): a plain number ``0.75`` / ``.75`` / ``1``; a percentage
    ``80%`` (divided by 100); a fraction ``8/10`` or ``8 out of 10`` (divided by the denominator).
    When the word "score" is followed by such a value (``Score: 0.8``, ``score=1``,
    ``**Score:** 8/10``, ``score is 80%``) the last such value is taken; otherwise the last value
    anywhere in the text. Placeholders with letters in angle brackets (an echoed
    ``Score: <number between 0 and 1>``) are ignored. A value outside [0, 1] after normalisation (``1.01``, ``Score: 8``,
    ``-0.2``, ``120%``) or a zero denominator is a parse failure: it is not clamped, because a
    judge that answers on the wrong scale has not given a score we can trust.
    """
    text = _PLACEHOLDER_RE.sub(" ", text)
    matches = list(_KEYWORD_RE.finditer(text)) or list(_VALUE_RE.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    value = float(m.group("num"))
    if m.group("pct"):
        value /= 100.0
    elif m.group("den") is not None:
        den = float(m.group("den"))
        if den <= 0:
            return None
        value /= den
    return value if 0.0 <= value <= 1.0 else None


@dataclass
class JudgeScores:
    """Per-episode judge results, in the order of the histories given."""

    scores: list[float]  # parsed score, or the default score where parsing failed
    parsed: list[bool]  # False where the default score stands in
    replies: list[str] = field(default_factory=list)  # the judge's raw replies (for logging)

    @property
    def num_failures(self) -> int:
        return sum(not ok for ok in self.parsed)


def render_transcript(history: Sequence[dict[str, str]]) -> str:
    """One ``role: content`` line group per message, blank lines squeezed (compact for the judge)."""
    lines = []
    for message in history:
        content = re.sub(r"\n\s*\n+", "\n", str(message.get("content", "")).strip())
        lines.append(f"{message.get('role', 'unknown')}: {content}")
    return "\n".join(lines)


class LLMJudge:
    """Scores episodes with a rubric through any generation backend.

    ``num_calls`` counts judged items (one judgement per episode and rubric), ``num_parse_failures``
    those whose reply had no usable score, ``num_generate_calls`` the batched backend calls.
    """

    def __init__(
        self,
        backend: GenerationBackend,
        tokenizer,
        cfg: JudgeConfig,
        *,
        max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    ) -> None:
        if max_prompt_tokens <= 0:
            raise ConfigError(f"the judge's max_prompt_tokens must be positive, got {max_prompt_tokens}")
        if not 0.0 <= cfg.default_score <= 1.0:
            raise ConfigError(f"absolute_zero.judge.default_score must be in [0, 1], got {cfg.default_score}")
        _check_context(backend, max_prompt_tokens, cfg.max_new_tokens)
        self.backend = backend
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.max_prompt_tokens = max_prompt_tokens
        self.num_calls = 0
        self.num_parse_failures = 0
        self.num_generate_calls = 0

    def build_prompt(self, history: Sequence[dict[str, str]], rubric: str) -> list[int]:
        """Prompt ids (system: rubric, user: transcript) of at most ``max_prompt_tokens`` tokens.

        The transcript is cut from the front: the end of an episode (what the assistant finally
        did) matters most for both rubrics. Token counts of a cut text and of the whole prompt are
        not exactly additive under BPE, so the cut shrinks until the encoded prompt fits.
        """
        transcript = render_transcript(history)
        # verbose=False: a transcript longer than the model's context is expected here (it is cut).
        body = self.tokenizer(transcript, add_special_tokens=False, verbose=False)["input_ids"]
        overhead = len(self._encode(rubric, ""))
        if len(body) + overhead <= self.max_prompt_tokens:
            ids = self._encode(rubric, transcript)
            if len(ids) <= self.max_prompt_tokens:
                return ids
        keep = min(len(body), self.max_prompt_tokens - overhead) - self._marker_tokens()
        while keep > 0:
            ids = self._encode(rubric, TRUNCATION_MARKER + self.tokenizer.decode(body[-keep:]))
            excess = len(ids) - self.max_prompt_tokens
            if excess <= 0:
                return ids
            keep -= excess
        raise ConfigError(
            f"the judge rubric alone does not fit in max_prompt_tokens={self.max_prompt_tokens}; "
            "shorten absolute_zero.judge.*_rubric or raise the budget"
        )

    def score_many(
        self, histories: Sequence[Sequence[dict[str, str]]], rubric: str | Sequence[str]
    ) -> JudgeScores:
        """Judge every history (one rubric for all, or one per history) with one generate call."""
        rubrics = [rubric] * len(histories) if isinstance(rubric, str) else list(rubric)
        if len(rubrics) != len(histories):
            raise ValueError(f"{len(rubrics)} rubrics for {len(histories)} histories")
        if not histories:
            return JudgeScores(scores=[], parsed=[], replies=[])
        requests = [
            GenerationRequest(prompt_ids=self.build_prompt(h, r), request_id=i)
            for i, (h, r) in enumerate(zip(histories, rubrics))
        ]
        sampling = SamplingParams(n=1, greedy=True, max_new_tokens=self.cfg.max_new_tokens)
        outputs = self.backend.generate(requests, sampling)
        self.num_generate_calls += 1
        if len(outputs) != len(requests):
            raise RuntimeError(f"judge backend returned {len(outputs)} outputs for {len(requests)} requests")
        replies = [out.samples[0].text if out.samples else "" for out in outputs]
        parsed_values = [parse_judge_score(text) for text in replies]
        result = JudgeScores(
            scores=[self.cfg.default_score if v is None else v for v in parsed_values],
            parsed=[v is not None for v in parsed_values],
            replies=replies,
        )
        self.num_calls += len(replies)
        self.num_parse_failures += result.num_failures
        return result

    def _encode(self, rubric: str, transcript: str) -> list[int]:
        messages = [{"role": "system", "content": rubric}]
        messages += [{"role": m["role"], "content": m["content"]} for m in self.cfg.demonstrations]
        messages.append({"role": "user", "content": transcript})
        return encode_prompt(self.tokenizer, messages)

    def _marker_tokens(self) -> int:
        return len(self.tokenizer(TRUNCATION_MARKER, add_special_tokens=False)["input_ids"])


def _check_context(backend: object, max_prompt_tokens: int, max_new_tokens: int) -> None:
    """Refuse a budget the judge model cannot hold (when the backend exposes an HF model config)."""
    config = getattr(getattr(backend, "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and max_prompt_tokens + max_new_tokens > positions:
        raise ConfigError(
            f"judge max_prompt_tokens ({max_prompt_tokens}) + absolute_zero.judge.max_new_tokens "
            f"({max_new_tokens}) exceeds the judge model's {positions} positions"
        )


def check_judge_config(cfg: JudgeConfig) -> None:
    """``absolute_zero.judge`` keys (called by the config validation)."""
    if cfg.on_parse_failure not in PARSE_FAILURE_POLICIES:
        raise ConfigError(
            f"absolute_zero.judge.on_parse_failure={cfg.on_parse_failure!r}; use one of "
            f"{', '.join(PARSE_FAILURE_POLICIES)}"
        )
    if not 0.0 <= cfg.default_score <= 1.0:
        raise ConfigError(f"absolute_zero.judge.default_score must be in [0, 1], got {cfg.default_score}")
    if cfg.max_new_tokens < 1 or cfg.max_prompt_tokens < 1:
        raise ConfigError("absolute_zero.judge.max_new_tokens and max_prompt_tokens must be >= 1")
    for i, m in enumerate(cfg.demonstrations):
        if not isinstance(m, dict) and not hasattr(m, "keys"):
            raise ConfigError(f"absolute_zero.judge.demonstrations[{i}] must be a {{role, content}} mapping")
        if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
            raise ConfigError(
                f"absolute_zero.judge.demonstrations[{i}] needs role user|assistant and a content string"
            )
    if cfg.model_path and not _is_preset(cfg.model_path) and not Path(cfg.model_path).expanduser().is_dir():
        raise ConfigError(
            f"absolute_zero.judge.model_path={cfg.model_path!r}: no such folder (or model preset)"
        )


def _is_preset(name: str) -> bool:
    from nemo_azr.models.importer import PRESETS

    return name in PRESETS


def build_judge(
    cfg: JudgeConfig,
    *,
    policy_backend: GenerationBackend | None,
    tokenizer,
    device: str | torch.device = "cpu",
    max_prompt_tokens: int | None = None,
    dtype: str = "auto",
) -> LLMJudge:
    """The judge: the policy's own backend when ``cfg.model_path`` is "", else a separate frozen
    model (a local folder, or a preset imported on first use). ``max_prompt_tokens`` defaults to
    ``cfg.max_prompt_tokens``; ``dtype`` is passed to ``from_pretrained`` ("auto": the checkpoint's own).
    """
    budget = cfg.max_prompt_tokens if max_prompt_tokens is None else max_prompt_tokens
    if not cfg.model_path:
        if policy_backend is None:
            raise ConfigError(
                "absolute_zero.judge.model_path is empty (judge with the policy) but no policy backend was given"
            )
        return LLMJudge(policy_backend, tokenizer, cfg, max_prompt_tokens=budget)
    if _is_preset(cfg.model_path):
        from nemo_azr.models.importer import ensure_preset

        folder = Path(ensure_preset(cfg.model_path))
    else:
        folder = Path(cfg.model_path).expanduser()
    if not (folder / "config.json").is_file():
        raise ConfigError(
            f"absolute_zero.judge.model_path {cfg.model_path!r} is not a local HF model folder "
            "(config.json missing); the judge is never downloaded from a hub"
        )
    judge_tokenizer = load_tokenizer(folder)
    torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True, dtype=torch_dtype)
    model.eval()
    model.requires_grad_(False)  # inference only: no grad buffers, no optimizer state
    # The backend deep-copies its model; build it on the CPU and move only that copy, so the
    # accelerator never holds two judges.
    backend = HFGenerationBackend(model, judge_tokenizer)
    del model
    backend.model.to(torch.device(device))
    return LLMJudge(backend, judge_tokenizer, cfg, max_prompt_tokens=budget)
