"""One measured attempt of ``azr_sandbox_smollm2`` from start to report, unattended and resumable.

    nohup python benchmarks/selfplay_attempt.py NAME [--steps 40] [--fixed-steps 0,40] [--passes 2] \\
        [--warmup-from outputs/OTHER_RUN] -- absolute_zero.sandbox_os.proposer_sees_success=true ... &

Runs, each step skipped when its output is already there (so the same command after an
interruption continues where it stopped):

1. training: ``nemo-azr train experiment=azr_sandbox_smollm2`` into ``outputs/NAME`` (warm-up, then
   RL; ``trainer`` resumes from the newest checkpoint). ``--warmup-from`` copies another run's
   ``step_0`` and ``kl_reference`` first, for overrides that leave the warm-up's prompts as they were;
2. the proposer against a fixed solver (decision 194): for every checkpoint of ``--fixed-steps``,
   a pass with 3 proposals a held-out goal at ``seed=0`` and one with 6 at ``seed=1`` (``--passes 3``
   adds one with 6 at ``seed=2``, and so on), every parsed question solved 5 times by the run's
   warmed-up ``step_0``, into ``outputs/fixed_eval/NAME_step_N``, ``..._seed1``, ...;
3. the report: the training windows (``selfplay_windows.py``), the pooled fixed-solver table with
   its slope (``selfplay_proposer_table.py --slope``, with ``--success-must-fit-seed`` when the
   overrides turn the rule on) and the plot (``nemo-azr plot-selfplay``), written to
   ``outputs/NAME/attempt_report.md``.

The overrides after ``--`` go to training and to every evaluation (a prompt key must match in
both). Each command's output goes to a log beside its results; a failed command stops the script
with its log's path.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nemo_azr.trainer.preemption import EXIT_PREEMPTED

EXPERIMENT = "azr_sandbox_smollm2"  # --experiment: another self-play experiment with a saved step_0
PASSES = 2  # --passes: the two passes docs/selfplay.md pools for runs 16-19
RULE_KEY = "absolute_zero.sandbox_os.success_must_fit_seed"
SAVE_INTERVAL = 8  # checkpoints every 8 steps (and the last): the steps a fixed-solver pass can read
HERE = Path(__file__).resolve().parent


def fixed_passes(count: int) -> list[tuple[int, int, str]]:
    """(seed, proposals a held-out goal, directory suffix) of each fixed-solver pass: seed 0 with 3
    proposals a goal (as the default evaluation), then seeds 1, 2, ... with 6 each. A third pass
    narrows a pooled ratio's standard error by about a fifth (270 -> 450 proposals a checkpoint)."""
    return [(0, 3, "")] + [(seed, 6, f"_seed{seed}") for seed in range(1, count)]


@dataclass(frozen=True)
class Command:
    argv: list[str]
    done_marker: Path  # the command is skipped when this exists
    log: Path


def rule_on(overrides: Sequence[str]) -> bool:
    """Whether the overrides turn decision 196's rule on (then the table reads the passes under it)."""
    value = None
    for item in overrides:
        key, _, val = item.lstrip("+").partition("=")
        if key == RULE_KEY:
            value = val.strip().lower()
    return value in ("true", "1", "yes")


@dataclass(frozen=True)
class Attempt:
    """What one attempt trains and evaluates, and where."""

    name: str
    steps: int
    fixed_steps: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    experiment: str = EXPERIMENT
    outputs: Path = Path("outputs")
    passes: int = PASSES

    @property
    def run(self) -> Path:
        return self.outputs / self.name

    def fixed_pass_dir(self, step: int, suffix: str) -> Path:
        return self.outputs / "fixed_eval" / f"{self.name}_step_{step}{suffix}"

    def train_command(self) -> Command:
        argv = [
            "nemo-azr", "train", f"experiment={self.experiment}", f"trainer.output_dir={self.run}",
            f"trainer.max_steps={self.steps}", f"trainer.save_interval={SAVE_INTERVAL}", "trainer.keep_last=0",
            *self.overrides,
        ]  # fmt: skip
        return Command(argv, self.run / "checkpoints" / f"step_{self.steps}", self.run / "train.log")

    def fixed_commands(self) -> list[Command]:
        """Every fixed-solver pass, the shorter seed-0 passes of all checkpoints first (a stopped
        script has then compared the ends of the run once before it spends time on the second passes)."""
        checkpoints = self.run / "checkpoints"
        commands = []
        for seed, per_goal, suffix in fixed_passes(self.passes):
            for step in self.fixed_steps:
                out = self.fixed_pass_dir(step, suffix)
                argv = [
                    "nemo-azr", "eval", f"experiment={self.experiment}", f"seed={seed}", *self.overrides,
                    f"eval.checkpoint={checkpoints / f'step_{step}'}", "eval.selfplay_solver=false",
                    f"eval.selfplay_fixed_solver={checkpoints / 'step_0'}",
                    f"eval.selfplay_proposals_per_seed={per_goal}", f"eval.output_dir={out}",
                ]  # fmt: skip
                commands.append(Command(argv, out / "metrics.json", out.with_name(out.name + ".log")))
        return commands

    def table_argv(self) -> list[str]:
        """``selfplay_proposer_table.py`` over the pooled passes of each checkpoint."""
        argv = [sys.executable, str(HERE / "selfplay_proposer_table.py"), "--slope"]
        if rule_on(self.overrides):
            argv.append("--success-must-fit-seed")
        for step in self.fixed_steps:
            dirs = ",".join(
                str(self.fixed_pass_dir(step, suffix)) for *_, suffix in fixed_passes(self.passes)
            )
            argv.append(f"step_{step}={dirs}")
        return argv

    def report(self) -> str:
        windows = subprocess.run(
            [sys.executable, str(HERE / "selfplay_windows.py"), str(self.run / "metrics.jsonl"), "--window", "10"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        table = subprocess.run(self.table_argv(), capture_output=True, text=True, check=True).stdout
        subprocess.call(
            ["nemo-azr", "plot-selfplay", f"experiment={self.experiment}", f"trainer.output_dir={self.run}"],
            stdout=subprocess.DEVNULL,
        )
        return (
            f"# {self.name} ({self.experiment})\n\nOverrides: `{' '.join(self.overrides) or '(none)'}`\n\n"
            f"## Training\n\n{windows}\n## The proposer against the fixed warmed-up solver\n\n{table}"
        )


def run_logged(command: Command) -> None:
    if command.done_marker.exists():
        print(f"skip (done): {command.done_marker}", flush=True)
        return
    command.log.parent.mkdir(parents=True, exist_ok=True)
    print(f"run: {' '.join(command.argv)}\n  log: {command.log}", flush=True)
    with command.log.open("a") as log:
        code = subprocess.call(command.argv, stdout=log, stderr=subprocess.STDOUT)
    if code == EXIT_PREEMPTED:
        sys.exit(
            f"selfplay_attempt: {command.argv[1]} was stopped by a signal and saved its progress "
            f"(exit status {code}); the same command continues it; see {command.log}"
        )
    if code != 0:
        sys.exit(f"selfplay_attempt: exit status {code}; see {command.log}")


def copy_warmup(source: Path, run: Path) -> None:
    """Start ``run`` from ``source``'s warmed-up ``step_0`` and KL reference (never over a run's own)."""
    target = run / "checkpoints" / "step_0"
    if target.exists():
        return
    for what in (source / "checkpoints" / "step_0", source / "kl_reference"):
        if not what.is_dir():
            sys.exit(f"selfplay_attempt: --warmup-from {source}: {what} is missing")
    shutil.copytree(source / "checkpoints" / "step_0", target)
    shutil.copytree(source / "kl_reference", run / "kl_reference", dirs_exist_ok=True)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    # the overrides follow "--" (split here: argparse would give a positional before them all of it)
    cut = argv.index("--") if "--" in argv else len(argv)
    argv, overrides = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the run's name: outputs/NAME, outputs/fixed_eval/NAME_step_N")
    parser.add_argument("--steps", type=int, default=40, help="RL steps (default 40)")
    parser.add_argument(
        "--fixed-steps", default=None, help="checkpoints for the fixed-solver passes (0,STEPS)"
    )
    parser.add_argument(
        "--passes",
        type=int,
        default=PASSES,
        help=f"fixed-solver passes a checkpoint, pooled (default {PASSES}; a third: seed 2, 6 a goal)",
    )
    parser.add_argument("--warmup-from", type=Path, default=None, help="a run whose step_0 to start from")
    parser.add_argument("--experiment", default=EXPERIMENT, help=f"the experiment (default {EXPERIMENT})")
    parser.add_argument("--outputs", type=Path, default=Path("outputs"), help="the outputs root")
    args = parser.parse_args(argv)
    args.overrides = overrides
    if args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    if args.passes < 1:
        parser.error(f"--passes must be >= 1, got {args.passes}")
    raw = args.fixed_steps or f"0,{args.steps}"
    try:
        args.fixed_steps = sorted({int(s) for s in raw.split(",")})
    except ValueError:
        parser.error(f"--fixed-steps takes checkpoint steps separated by commas, got {raw!r}")
    saved = {0, args.steps, *range(SAVE_INTERVAL, args.steps, SAVE_INTERVAL)}
    if not set(args.fixed_steps) <= saved:
        parser.error(
            f"--fixed-steps {raw}: checkpoints are saved at step 0, every {SAVE_INTERVAL} steps and at "
            f"step {args.steps}; {sorted(set(args.fixed_steps) - saved)} is none of them"
        )
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    attempt = Attempt(
        args.name,
        args.steps,
        tuple(args.fixed_steps),
        tuple(args.overrides),
        args.experiment,
        args.outputs,
        args.passes,
    )
    if args.warmup_from is not None:
        copy_warmup(args.warmup_from, attempt.run)
    run_logged(attempt.train_command())
    for command in attempt.fixed_commands():
        run_logged(command)
    text = attempt.report()
    (attempt.run / "attempt_report.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
