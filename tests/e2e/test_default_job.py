"""The README's default job (tiny model, arithmetic, GRPO on CPU) visibly raises reward."""

import pytest

from tests.e2e.train_cli import reward_first_last, train_cli

WINDOW = 10


@pytest.mark.e2e
def test_default_job_raises_reward(tiny_cache, tmp_path):
    out = tmp_path / "run"
    records = train_cli(
        out, f"model.tiny.cache_dir={tiny_cache}", "logger.wandb.mode=offline", "logger.console=false"
    )
    first, last = reward_first_last(records, WINDOW)
    assert last > first + 0.15, f"reward did not rise enough: first {first:.3f}, last {last:.3f}"
    assert (out / "checkpoints" / f"step_{len(records)}" / "COMPLETE").is_file()
    assert any((out / "wandb").glob("offline-run-*")), "W&B offline run folder missing"
