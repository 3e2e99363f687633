"""The warm-up's progress lines: when they come and what they estimate (a fake clock, no waiting)."""

from __future__ import annotations

import pytest

from nemo_azr.trainer.progress import StepProgress


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run_steps(progress: StepProgress, clock: FakeClock, steps: range, seconds_per_step: float) -> None:
    for step in steps:
        clock.now += seconds_per_step
        progress(step, 0.5)


def test_first_step_every_tenth_and_last_step_at_a_fast_pace():
    clock, lines = FakeClock(), []
    progress = StepProgress("warm-up", 25, lines.append, clock=clock, every=10, seconds=120)
    run_steps(progress, clock, range(25), seconds_per_step=2.0)
    assert [line.split(",")[0] for line in lines] == [
        "warm-up: step 1/25",
        "warm-up: step 10/25",
        "warm-up: step 20/25",
        "warm-up: step 25/25",
    ]
    # step 10: 20 s for 10 steps -> 2.0 s/step, 15 steps left -> 30 s
    assert lines[1] == "warm-up: step 10/25, loss 0.500, 2.0 s/step, 20 s elapsed, about 30 s left"
    assert "left" not in lines[-1]


def test_slow_steps_report_by_wall_time_with_an_estimate_in_minutes():
    clock, lines = FakeClock(), []
    progress = StepProgress("warm-up", 40, lines.append, clock=clock, every=10, seconds=120)
    run_steps(progress, clock, range(5), seconds_per_step=133.0)
    # each 133 s step passes the 120 s mark: a line per step, not one after 22 minutes
    assert [line.split(",")[0] for line in lines] == [f"warm-up: step {k}/40" for k in range(1, 6)]
    # after step 5: 133 s/step x 35 steps = 4655 s -> 78 min
    assert lines[-1].endswith("133.0 s/step, 11 min elapsed, about 78 min left")


def test_a_resumed_warmup_times_only_its_own_steps():
    clock, lines = FakeClock(), []
    progress = StepProgress("warm-up", 40, lines.append, first_step=30, clock=clock, every=10, seconds=600)
    run_steps(progress, clock, range(30, 40), seconds_per_step=3.0)
    assert lines[0] == "warm-up: step 31/40, loss 0.500, 3.0 s/step, 3 s elapsed, about 27 s left"
    assert lines[-1] == "warm-up: step 40/40, loss 0.500, 3.0 s/step, 30 s elapsed"
    assert len(lines) == 2


def test_the_rate_is_the_last_steps_so_a_paused_stretch_leaves_the_estimate():
    clock, lines = FakeClock(), []
    progress = StepProgress("warm-up", 40, lines.append, clock=clock, every=10, seconds=1e9)
    run_steps(progress, clock, range(3), seconds_per_step=100.0)
    run_steps(progress, clock, range(3, 4), seconds_per_step=3700.0)  # paused for an hour
    run_steps(progress, clock, range(4, 10), seconds_per_step=100.0)
    # step 10: the window (steps 1-10) holds the paused one: (9 x 100 + 3700) / 10 = 460 s/step
    assert lines[1] == "warm-up: step 10/40, loss 0.500, 460.0 s/step, 77 min elapsed, about 3.8 h left"
    run_steps(progress, clock, range(10, 20), seconds_per_step=100.0)
    # step 20: steps 11-20 only: 100 s/step, 20 left -> 2000 s = 33 min (the mean since the
    # start, 5600 s / 20 = 280 s/step, would say 93 min)
    assert lines[2] == "warm-up: step 20/40, loss 0.500, 100.0 s/step, 1.6 h elapsed, about 33 min left"


def test_long_runs_are_estimated_in_hours():
    clock, lines = FakeClock(), []
    progress = StepProgress("warm-up", 1000, lines.append, clock=clock)
    run_steps(progress, clock, range(1), seconds_per_step=36.0)
    assert lines == ["warm-up: step 1/1000, loss 0.500, 36.0 s/step, 36 s elapsed, about 10.0 h left"]


@pytest.mark.parametrize("every, seconds", [(0, 120.0), (10, 0.0)])
def test_non_positive_intervals_are_refused(every, seconds):
    with pytest.raises(ValueError, match="must be positive"):
        StepProgress("warm-up", 10, print, every=every, seconds=seconds)
