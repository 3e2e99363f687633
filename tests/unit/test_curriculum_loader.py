"""data.curriculum=feedback: prompts drawn by the moving average of their feedback, resumable."""

from collections import Counter

import pytest

from nemo_azr.contracts.task import Example
from nemo_azr.errors import CheckpointError, ConfigError
from nemo_azr.tasks.dataloader import FeedbackCurriculumLoader, PromptLoader


def _examples(n: int) -> list[Example]:
    return [Example(prompt_id=f"p{i}", question=str(i), answer=str(i)) for i in range(n)]


def _loader(n=10, batch=4, **kw) -> FeedbackCurriculumLoader:
    return FeedbackCurriculumLoader(
        _examples(n),
        batch,
        seed=kw.pop("seed", 0),
        floor=kw.pop("floor", 0.1),
        decay=kw.pop("decay", 0.5),
        rank_temperature=kw.pop("rank_temperature", 0.0),
    )


def test_moving_average_by_hand():
    loader = _loader(decay=0.5)
    loader.record({"p0": 0.0})
    loader.record({"p0": 1.0, "p1": 0.0, "elsewhere": 1.0})
    assert loader.usefulness["p0"] == pytest.approx(0.5 * (0.5 * 1.0 + 0.5 * 0.0) + 0.5 * 1.0)
    assert loader.usefulness["p1"] == pytest.approx(0.5)
    assert "elsewhere" not in loader.usefulness
    assert loader.usefulness["p2"] == 1.0  # untried prompts stay at the optimistic start


def test_batches_hold_distinct_prompts_and_follow_the_feedback():
    loader = _loader(n=10, batch=4, floor=0.1, decay=0.0)
    useful = {f"p{i}" for i in range(5)}
    loader.record({f"p{i}": 1.0 if f"p{i}" in useful else 0.0 for i in range(10)})
    counts: Counter = Counter()
    for _ in range(300):
        batch = loader.next_batch()
        assert len({e.prompt_id for e in batch}) == 4
        counts.update(e.prompt_id for e in batch)
    # weights 1.1 vs 0.1: the useful half is drawn far more often, the rest still sometimes
    assert sum(counts[p] for p in useful) > 4 * sum(counts[p] for p in counts if p not in useful)
    assert all(counts[f"p{i}"] > 0 for i in range(10))


def test_rank_weights_by_hand():
    """floor + (1/rank)^(1/T), the rank by usefulness, equal values sharing the better place."""
    loader = _loader(n=4, floor=0.1, decay=0.0, rank_temperature=0.5)
    loader.record({"p0": 0.2, "p1": 0.9, "p2": 0.2, "p3": 0.05})
    # places: p1 1st, p0 and p2 share 2nd, p3 4th
    expected = [0.1 + (1 / 2) ** 2, 0.1 + 1.0, 0.1 + (1 / 2) ** 2, 0.1 + (1 / 4) ** 2]
    assert loader.weights().tolist() == pytest.approx(expected)


def test_ranks_narrow_the_draws_where_close_values_do_not():
    """Usefulness 0.30 .. 0.39 over ten prompts: by value the weights differ by 1.3x, by rank the best
    prompt is drawn far more often than the worst."""
    values = {f"p{i}": 0.30 + 0.01 * i for i in range(10)}
    shares = {}
    for temperature in (0.0, 0.5):
        loader = _loader(n=10, batch=1, floor=0.02, decay=0.0, rank_temperature=temperature)
        loader.record(values)
        counts = Counter(loader.next_batch()[0].prompt_id for _ in range(2000))
        shares[temperature] = counts["p9"] / max(counts["p0"], 1)
    assert shares[0.0] < 2  # 0.41 / 0.32
    assert shares[0.5] > 20  # 1.02 / (0.02 + 0.01)


def test_same_seed_same_batches_and_resume_continues_exactly():
    a, b = _loader(seed=3), _loader(seed=3)
    for loader in (a, b):
        loader.record({"p1": 0.0, "p2": 0.3})
    assert [[e.prompt_id for e in a.next_batch()] for _ in range(5)] == [
        [e.prompt_id for e in b.next_batch()] for _ in range(5)
    ]
    state = a.state_dict()
    resumed = _loader(seed=3)
    resumed.load_state_dict(state)
    a.record({"p3": 0.0})
    resumed.record({"p3": 0.0})
    assert [[e.prompt_id for e in a.next_batch()] for _ in range(5)] == [
        [e.prompt_id for e in resumed.next_batch()] for _ in range(5)
    ]


def test_bad_settings_and_states_are_named():
    with pytest.raises(ConfigError, match="floor"):
        _loader(floor=0.0)
    with pytest.raises(ConfigError, match="rank temperature"):
        _loader(rank_temperature=-1.0)
    broken = {**_loader().state_dict(), "usefulness": "not a mapping"}
    with pytest.raises(CheckpointError, match="malformed"):
        _loader().load_state_dict(broken)
    other = _loader(n=10).state_dict()
    other["usefulness"] = {f"q{i}": 1.0 for i in range(10)}
    with pytest.raises(CheckpointError, match="other prompts"):
        _loader(n=10).load_state_dict(other)


def test_more_prompts_per_step_than_prompts_draws_with_replacement():
    loader = _loader(n=3, batch=5)
    assert len(loader.next_batch()) == 5


def test_a_checkpoint_without_a_curriculum_starts_one_afresh(caplog):
    plain = PromptLoader(_examples(10), 4, shuffle=True, seed=0)
    plain.next_batch()
    loader = _loader()
    loader.load_state_dict(plain.state_dict())
    assert loader.draws == 0 and set(loader.usefulness.values()) == {1.0}
    assert "starts afresh" in caplog.text
