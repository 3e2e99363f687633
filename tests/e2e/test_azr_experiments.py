"""`experiment=azr_sandbox` runs 20 self-play steps on CPU with every seed metric logged each step,
and `nemo-azr plot-selfplay` draws the learnable ratio and proposer reward."""

import json
import math

import pytest

from nemo_azr.cli import main
from nemo_azr.trainer.metrics import read_metrics

STEPS = 20
SEED_METRICS = [
    "unified_filter/num_learnable",
    "unified_filter/num_total",
    "unified_filter/learnable_ratio",
    "unified_filter/num_sampled",
    "unified_filter/num_repropose",
    "repropose/total_attempts",
    "repropose/final_non_learnable",
    "harm/safety_score_mean",
    "harm/completion_score_mean",
    "harm/combined_reward_mean",
    "proposer/num_trajectories",
    "proposer/num_integrated",
    "proposer/reward_mean",
    "joint/combined_reward_mean",
    "joint/proposer_solver_ratio",
]


@pytest.mark.e2e
def test_azr_sandbox_20_steps_then_plot(tiny_cache, tmp_path, capsys):
    out = tmp_path / "azr_sandbox"
    common = [
        "experiment=azr_sandbox",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={out}",
        "logger=quiet",
    ]
    # A shorter warm-up than the experiment's keeps CI fast; the run must work either way.
    train = [
        "sft_warmup.steps=60",
        "sft_warmup.save=true",
        "trainer.keep_last=0",
        f"trainer.max_steps={STEPS}",
    ]
    assert main(["train", *common, *train]) == 0
    assert (out / "checkpoints" / "step_0" / "COMPLETE").is_file()  # the warmed-up model is kept
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for r in records:
        missing = [k for k in SEED_METRICS if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        assert all(math.isfinite(r[k]) for k in SEED_METRICS)
        assert 0.0 <= r["unified_filter/learnable_ratio"] <= 1.0
        assert r["repropose/total_attempts"] <= 3
        assert r["proposer/num_integrated"] == 4  # one proposer row per seed prompt, every step
        assert -0.5 <= r["proposer/reward_mean"] <= 1.0
        if "actor/loss" in r:
            assert math.isfinite(r["actor/loss"])
    # the warm-up made the model emit parseable groups at least sometimes
    assert sum(r["unified_filter/num_total"] for r in records) > 0
    assert main(["plot-selfplay", *common]) == 0
    assert (out / "selfplay.png").stat().st_size > 1000
    assert "proposer/reward_mean" in capsys.readouterr().out
    # the held-out evaluation: 12 of the 120 tasks greedy, proposals for 12 of the 30 held-out seeds
    assert (
        main(
            [
                "eval",
                *common,
                "eval.num_examples=12",
                "eval.checkpoint=" + str(out / "checkpoints" / "step_0"),
            ]
        )
        == 0
    )
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    samples = [json.loads(line) for line in (out / "eval" / "samples.jsonl").read_text().splitlines()]
    solver = [r for r in samples if r["part"] == "solver"]
    proposals = [r for r in samples if r["part"] == "proposer"]
    assert len(solver) == metrics["solver"]["num_tasks"] == 12 and len(proposals) == 12
    for r in solver:  # the harm reward is the seeds' 0.7 safety + 0.3 completion of each episode
        assert r["harm_reward"] == pytest.approx(0.7 * r["safety"] + 0.3 * r["completion"])
    assert metrics["harm_reward"] == pytest.approx(sum(r["harm_reward"] for r in solver) / 12, abs=1e-4)
    parsed = [r for r in proposals if r["parsed"]]
    assert metrics["proposer"]["parse_rate"] == pytest.approx(len(parsed) / 12, abs=1e-4)
    assert all(len(r["learnable"]) == 3 for r in parsed)
    printed = capsys.readouterr().out
    assert "harm_reward=" in printed
    # progress while it runs: the solver part turn by turn, then the proposer part's size
    assert "eval: solving 12 held-out tasks" in printed and "eval: solver turn 1/" in printed
    assert "eval: 12 proposals for held-out seeds" in printed
    # the proposer part alone, its questions solved by a fixed model (the trained step): the same
    # proposals as above (same checkpoint, same seed), judged by another solver
    fixed = out / "checkpoints" / f"step_{STEPS}"
    args = [
        "eval",
        *common,
        "eval.num_examples=12",
        "eval.checkpoint=" + str(out / "checkpoints" / "step_0"),
        "eval.selfplay_solver=false",
        f"eval.selfplay_fixed_solver={fixed}",
        f"eval.output_dir={out / 'eval_fixed'}",
    ]
    assert main(args) == 0
    fixed_metrics = json.loads((out / "eval_fixed" / "metrics.json").read_text())
    fixed_samples = [json.loads(x) for x in (out / "eval_fixed" / "samples.jsonl").read_text().splitlines()]
    assert fixed_metrics["solver"] is None and "harm_reward" not in fixed_metrics
    assert fixed_metrics["proposer_questions_solved_by"] == str(fixed)
    assert metrics["proposer_questions_solved_by"] == str(out / "checkpoints" / "step_0")
    assert [r["part"] for r in fixed_samples] == ["proposer"] * 12
    assert [r["proposal"] for r in fixed_samples] == [r["proposal"] for r in proposals]
    assert fixed_metrics["proposer"]["parse_rate"] == metrics["proposer"]["parse_rate"]
    assert fixed_metrics["generated_tokens_per_s"] > 0  # the proposer part's tokens are counted too
