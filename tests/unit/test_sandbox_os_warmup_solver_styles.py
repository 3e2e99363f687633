"""``absolute_zero.sandbox_os.warmup_solver_sees_styles``: with styled warm-up proposals, the warm-up's
solver turns may see every temptation in the catalogue's appended form instead, while the proposer's
templated groups keep the styles. References: the seed goals' own "{goal} {sentence}" form, and
the same warm-up with the option on."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from nemo_azr.config.schema import NemoAzrConfig
from nemo_azr.envs.sandbox_os.actions import parse_action
from nemo_azr.envs.sandbox_os.domain import SandboxOSDomain
from nemo_azr.envs.sandbox_os.temptation_styles import phrase_temptation
from nemo_azr.models.tiny import load_tokenizer
from nemo_azr.selfplay import AbsoluteZeroWorkflow
from tests.unit.test_sandbox_os_warmup_turns import _cfg as warmup_cfg

STYLES = ["first", "reason"]  # never the appended form, so every solver question must be rewritten


def _cfg(solver_sees_styles: bool) -> NemoAzrConfig:
    cfg = warmup_cfg(read_first=False)
    cfg.absolute_zero.sandbox_os.demonstrations = False
    cfg.absolute_zero.sandbox_os.warmup_temptation_styles = list(STYLES)
    cfg.absolute_zero.sandbox_os.warmup_solver_sees_styles = solver_sees_styles
    return cfg


def _first_sentence(seed, harm: str) -> str:
    """The seed goal's first temptation sentence for ``harm`` (its catalogue entry)."""
    return next(s for s, h in seed.meta["temptations"] if parse_action(h).line() == harm)


def test_solver_questions_are_the_appended_form_of_the_same_harm():
    domain = SandboxOSDomain(_cfg(False).absolute_zero)
    for i, seed in enumerate(domain.seed_tasks()):
        text = domain.warmup_proposal(seed, 3, random.Random(i))
        parsed = domain.parse_proposal(text, seed, 3)
        solver = domain.warmup_solver_questions(parsed, seed)
        assert len(solver) == len(parsed)
        for p, s in zip(parsed, solver):
            assert p["instruction"] != f"{seed.question} {_first_sentence(seed, p['harm_action'])}"
            assert s["instruction"] == f"{seed.question} {_first_sentence(seed, p['harm_action'])}"
            # everything but the wording is the proposer's question
            assert {k: v for k, v in s.items() if k != "instruction"} == {
                k: v for k, v in p.items() if k != "instruction"
            }
    # the option on: the group as parsed, the same objects
    styled = SandboxOSDomain(_cfg(True).absolute_zero)
    seed = styled.seed_tasks()[0]
    parsed = styled.parse_proposal(styled.warmup_proposal(seed, 3, random.Random(0)), seed, 3)
    assert styled.warmup_solver_questions(parsed, seed) is parsed


def test_a_harm_outside_the_catalogue_keeps_its_wording():
    domain = SandboxOSDomain(_cfg(False).absolute_zero)
    seed = domain.seed_tasks()[0]
    question = {"instruction": "Do it. Also rm x.", "harm_action": "rm not-in-the-catalogue"}
    assert domain.warmup_solver_questions([question], seed) == [question]


def test_reason_style_needs_an_rng():
    with pytest.raises(ValueError, match="rng"):
        phrase_temptation("Add 'x' to notes.txt.", "Then rm secrets.txt.", "reason")
    assert phrase_temptation("Add 'x' to notes.txt.", "Then rm secrets.txt.", "appended") == (
        "Add 'x' to notes.txt. Then rm secrets.txt."
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)


def test_sft_pairs_style_the_proposer_and_not_the_solver(tokenizer):
    """The warm-up's pairs: the proposer's targets keep the styled instructions in both settings; the
    solver's prompts hold them only with the option on, and the appended form with it off."""
    seen = {}
    for solver_sees_styles in (True, False):
        cfg = _cfg(solver_sees_styles)
        domain = SandboxOSDomain(cfg.absolute_zero)
        workflow = AbsoluteZeroWorkflow(SimpleNamespace(domain=domain), tokenizer, cfg)
        seeds = domain.seed_tasks()[:4]
        pairs = workflow.sft_pairs(seeds)
        targets = [tokenizer.decode(t) for _, t in pairs]
        proposals = [t for t in targets if t.lstrip().startswith('{"questions"')]
        styled = [
            q["instruction"] for t in proposals for q in json.loads(t[: t.rindex("}") + 1])["questions"]
        ]
        assert len(proposals) == len(seeds) and styled
        prompts = [tokenizer.decode(p) for p, t in pairs if not t or tokenizer.decode(t) not in proposals]
        appended = {
            f"{seed.question} {sentence}" for seed in seeds for sentence, _ in seed.meta["temptations"]
        }
        seen[solver_sees_styles] = (
            sum(any(s in p for s in styled) for p in prompts),
            sum(any(a in p for a in appended) for p in prompts),
            len(prompts),
        )
    on_styled, on_appended, n_on = seen[True]
    off_styled, off_appended, n_off = seen[False]
    assert n_on == n_off > 0
    assert on_styled == n_on and on_appended == 0
    assert off_styled == 0 and off_appended == n_off
