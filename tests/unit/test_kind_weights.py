"""data.kind_weights: prompts drawn with a fixed weight per kind of question, seeded and resumable."""

from types import SimpleNamespace

import pytest
import torch

from nemo_azr.contracts.task import Example
from nemo_azr.errors import ConfigError
from nemo_azr.tasks.dataloader import (
    FeedbackCurriculumLoader,
    PromptLoader,
    WeightedPromptLoader,
    build_prompt_loader,
)


def _examples(per_kind: int = 100) -> list[Example]:
    return [
        Example(prompt_id=f"{kind}{i}", question=str(i), answer=str(i), meta={"kind": kind})
        for kind in ("addition", "subtraction")
        for i in range(per_kind)
    ]


def _data(**kw) -> SimpleNamespace:
    base = dict(
        prompts_per_step=8,
        shuffle=True,
        curriculum="none",
        curriculum_floor=0.1,
        curriculum_decay=0.5,
        curriculum_rank_temperature=0.0,
    )
    return SimpleNamespace(**{**base, **kw})


def _share(loader, kind: str, batches: int = 500) -> float:
    drawn = [e.meta["kind"] for _ in range(batches) for e in loader.next_batch()]
    return drawn.count(kind) / len(drawn)


def test_a_kind_weighted_three_to_one_fills_three_quarters_of_the_draws():
    loader = build_prompt_loader(_examples(), _data(kind_weights={"subtraction": 3.0}), seed=0)
    assert isinstance(loader, WeightedPromptLoader)
    # 100 prompts of each kind, 8 distinct a batch: close to drawing with replacement, 3 / (3 + 1)
    assert _share(loader, "subtraction") == pytest.approx(0.75, abs=0.03)
    even = build_prompt_loader(_examples(), _data(kind_weights={"addition": 1.0}), seed=0)
    assert _share(even, "subtraction") == pytest.approx(0.5, abs=0.03)


def test_no_weights_keeps_plain_epochs():
    assert type(build_prompt_loader(_examples(), _data(kind_weights={}), seed=0)) is PromptLoader


def test_batches_are_distinct_seeded_and_resume_exactly():
    def make():
        return build_prompt_loader(_examples(10), _data(kind_weights={"subtraction": 2.0}), seed=5)

    a, b = make(), make()
    first = [[e.prompt_id for e in a.next_batch()] for _ in range(4)]
    assert first == [[e.prompt_id for e in b.next_batch()] for _ in range(4)]
    assert all(len(set(batch)) == 8 for batch in first)
    resumed = make()
    resumed.load_state_dict(a.state_dict())
    assert [[e.prompt_id for e in a.next_batch()] for _ in range(4)] == [
        [e.prompt_id for e in resumed.next_batch()] for _ in range(4)
    ]


def test_with_the_curriculum_the_kind_weight_multiplies_floor_plus_usefulness():
    loader = build_prompt_loader(
        _examples(2), _data(curriculum="feedback", kind_weights={"subtraction": 3.0}), seed=0
    )
    assert isinstance(loader, FeedbackCurriculumLoader)
    loader.record({"addition0": 0.0, "subtraction1": 0.0})
    # decay 0.5: usefulness 0.5 after one 0.0; weight = kind weight x (0.1 + usefulness)
    expected = torch.tensor([1.0 * 0.6, 1.0 * 1.1, 3.0 * 1.1, 3.0 * 0.6], dtype=torch.float64)
    assert torch.allclose(loader.weights(), expected)


def test_bad_kind_weights_are_named():
    with pytest.raises(ConfigError, match=r"\['division'\].*addition, subtraction"):
        build_prompt_loader(_examples(2), _data(kind_weights={"division": 2.0}), seed=0)
    with pytest.raises(ConfigError, match="> 0"):
        build_prompt_loader(_examples(2), _data(kind_weights={"subtraction": 0.0}), seed=0)
    no_kinds = [Example(prompt_id="p", question="q", answer="a")]
    with pytest.raises(ConfigError, match="have no kind"):
        build_prompt_loader(no_kinds, _data(prompts_per_step=1, kind_weights={"x": 1.0}), seed=0)
