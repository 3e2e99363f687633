"""`nemo-azr train algorithm=ppo`: the default job with a critic raises reward like GRPO's, while the
critic learns (value loss down from its peak, explained variance above 0)."""

import statistics

import pytest

from tests.e2e.train_cli import reward_first_last, train_cli

WINDOW = 10
CRITIC_WINDOW = 50


@pytest.mark.e2e
def test_ppo_default_job_learns_with_its_critic(tiny_cache, tmp_path):
    out = tmp_path / "run"
    records = train_cli(
        out, "algorithm=ppo", f"model.tiny.cache_dir={tiny_cache}", "logger=quiet", timeout=1200
    )
    first, last = reward_first_last(records, WINDOW)
    assert last > first + 0.15, f"reward did not rise enough: first {first:.3f}, last {last:.3f}"

    def window(key: str, start: int, stop: int) -> float:
        return statistics.fmean(r[key] for r in records[start:stop])

    n = len(records)
    # The returns' spread grows while the policy improves, so the value loss first rises; it must
    # then come down, and the values must explain a share of the returns' variance.
    peak = max(
        window("critic/vf_loss", s, s + CRITIC_WINDOW) for s in range(0, n - CRITIC_WINDOW, CRITIC_WINDOW)
    )
    assert window("critic/vf_loss", n - CRITIC_WINDOW, n) < 0.95 * peak
    assert window("critic/explained_variance", n - CRITIC_WINDOW, n) > 0.05
    assert window("critic/explained_variance", 0, CRITIC_WINDOW) < window(
        "critic/explained_variance", n - CRITIC_WINDOW, n
    )
    assert (out / "checkpoints" / f"step_{n}" / "critic" / "model.safetensors").is_file()
