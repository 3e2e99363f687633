"""benchmarks/selfplay_attempt.py: the commands it plans, what it skips, how it fails (no model runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import selfplay_attempt as sa  # noqa: E402

RULE = "absolute_zero.sandbox_os.success_must_fit_seed"


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], False),
        ([f"{RULE}=true"], True),
        ([f"+{RULE}=True"], True),
        ([f"{RULE}=false"], False),
        ([f"{RULE}=true", f"{RULE}=false"], False),  # the last one wins, as in Hydra
        ([f"{RULE}_extra=true"], False),
    ],
)
def test_rule_on_reads_the_last_override_of_the_exact_key(overrides, expected):
    assert sa.rule_on(overrides) is expected


def test_training_command_carries_the_overrides_and_waits_for_the_last_checkpoint(tmp_path):
    cmd = sa.Attempt("run", 24, (0, 24), ("a.b=1",), outputs=tmp_path).train_command()
    assert cmd.argv[:3] == ["nemo-azr", "train", "experiment=azr_sandbox_smollm2"]
    assert f"trainer.output_dir={tmp_path / 'run'}" in cmd.argv
    assert "trainer.max_steps=24" in cmd.argv and cmd.argv[-1] == "a.b=1"
    assert cmd.done_marker == tmp_path / "run" / "checkpoints" / "step_24"


def test_fixed_passes_run_every_seed0_pass_first_against_step_0(tmp_path):
    attempt = sa.Attempt("r20", 40, (0, 16, 40), ("x=1",), outputs=tmp_path)
    run = tmp_path / "r20"
    cmds = attempt.fixed_commands()
    outs = [c.done_marker.parent.name for c in cmds]
    assert outs == [
        "r20_step_0",
        "r20_step_16",
        "r20_step_40",
        "r20_step_0_seed1",
        "r20_step_16_seed1",
        "r20_step_40_seed1",
    ]
    first, last = cmds[0].argv, cmds[-1].argv
    assert "seed=0" in first and "eval.selfplay_proposals_per_seed=3" in first
    assert "seed=1" in last and "eval.selfplay_proposals_per_seed=6" in last
    assert f"eval.checkpoint={run / 'checkpoints' / 'step_40'}" in last
    assert all(f"eval.selfplay_fixed_solver={run / 'checkpoints' / 'step_0'}" in c.argv for c in cmds)
    assert all("eval.selfplay_solver=false" in c.argv and "x=1" in c.argv for c in cmds)
    assert all(c.done_marker.name == "metrics.json" for c in cmds)


def test_the_table_pools_both_passes_and_reads_under_the_rule_only_when_it_is_on(tmp_path):
    root = tmp_path / "fixed_eval"
    plain = sa.Attempt("r20", 40, (0, 40), outputs=tmp_path).table_argv()
    assert "--slope" in plain and "--success-must-fit-seed" not in plain
    assert plain[-1] == f"step_40={root / 'r20_step_40'},{root / 'r20_step_40_seed1'}"
    assert (
        "--success-must-fit-seed"
        in sa.Attempt("r20", 40, (0, 40), (f"{RULE}=true",), outputs=tmp_path).table_argv()
    )


def test_a_third_pass_runs_after_the_first_two_and_the_table_pools_all_three(tmp_path):
    root = tmp_path / "fixed_eval"
    attempt = sa.Attempt("r20", 40, (0, 40), outputs=tmp_path, passes=3)
    cmds = attempt.fixed_commands()
    assert [c.done_marker.parent.name for c in cmds[4:]] == ["r20_step_0_seed2", "r20_step_40_seed2"]
    assert all("seed=2" in c.argv and "eval.selfplay_proposals_per_seed=6" in c.argv for c in cmds[4:])
    # the first four are the two-pass attempt's own: a rerun with --passes 3 skips them when done
    assert [c.argv for c in cmds[:4]] == [
        c.argv for c in sa.Attempt("r20", 40, (0, 40), outputs=tmp_path).fixed_commands()
    ]
    pooled = [root / f"r20_step_40{suffix}" for suffix in ("", "_seed1", "_seed2")]
    assert attempt.table_argv()[-1] == "step_40=" + ",".join(map(str, pooled))
    assert sa.parse_args(["r20", "--passes", "3"]).passes == 3
    assert sa.parse_args(["r20"]).passes == 2
    with pytest.raises(SystemExit):
        sa.parse_args(["r20", "--passes", "0"])


def test_fixed_steps_default_to_both_ends_and_must_be_saved_checkpoints():
    assert sa.parse_args(["r20", "--steps", "40"]).fixed_steps == [0, 40]
    assert sa.parse_args(["r20", "--steps", "20", "--fixed-steps", "16,0,20"]).fixed_steps == [0, 16, 20]
    for bad in (
        ["r20", "--fixed-steps", "12"],
        ["r20", "--fixed-steps", "48"],
        ["r20", "--fixed-steps", "a"],
    ):
        with pytest.raises(SystemExit):
            sa.parse_args(bad)


def test_a_done_command_is_skipped_and_a_failing_one_stops_with_its_log(tmp_path, capsys):
    marker = tmp_path / "done.json"
    marker.write_text("{}")
    never = sa.Command([sys.executable, "-c", "raise SystemExit(5)"], marker, tmp_path / "never.log")
    sa.run_logged(never)
    assert not never.log.exists() and "skip (done)" in capsys.readouterr().out
    failing = sa.Command(
        [sys.executable, "-c", "print('half-way'); raise SystemExit(3)"],
        tmp_path / "absent",
        tmp_path / "f.log",
    )
    with pytest.raises(SystemExit, match=r"exit status 3; see .*f\.log"):
        sa.run_logged(failing)
    assert "half-way" in failing.log.read_text()
    stopped = sa.Command(
        [sys.executable, "-c", "raise SystemExit(75)"], tmp_path / "absent", tmp_path / "s.log"
    )
    with pytest.raises(
        SystemExit, match=r"stopped by a signal and saved its progress .* same command continues"
    ):
        sa.run_logged(stopped)


def test_warmup_is_copied_once_and_a_missing_one_is_named(tmp_path):
    source, run = tmp_path / "src", tmp_path / "run"
    (source / "checkpoints" / "step_0").mkdir(parents=True)
    (source / "checkpoints" / "step_0" / "w.bin").write_text("warm")
    (source / "kl_reference").mkdir()
    (source / "kl_reference" / "r.bin").write_text("ref")
    sa.copy_warmup(source, run)
    assert (run / "checkpoints" / "step_0" / "w.bin").read_text() == "warm"
    assert (run / "kl_reference" / "r.bin").read_text() == "ref"
    (source / "checkpoints" / "step_0" / "w.bin").write_text("changed")
    sa.copy_warmup(source, run)  # the run's own step_0 is never replaced
    assert (run / "checkpoints" / "step_0" / "w.bin").read_text() == "warm"
    with pytest.raises(SystemExit, match="kl_reference is missing"):
        (tmp_path / "other" / "checkpoints" / "step_0").mkdir(parents=True)
        sa.copy_warmup(tmp_path / "other", tmp_path / "run2")


def test_overrides_follow_the_double_dash():
    args = sa.parse_args(["r20", "--steps", "16", "--", "a.b=1", "--c=2"])
    assert (args.name, args.steps, args.overrides) == ("r20", 16, ["a.b=1", "--c=2"])
    assert sa.parse_args(["r20"]).overrides == []
