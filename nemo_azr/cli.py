"""``nemo-azr`` command line: ``train``, ``eval``, ``train-rm``, ``convert``, ``plot-selfplay``, ``make-tiny-model``, ``show-config``.

Everything after the sub-command is a Hydra override (``trainer.max_steps=50 algorithm=rloo``).
User-facing problems print one ``nemo-azr: error: ...`` line and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from nemo_azr.errors import NemoAzrError, run_reporting_errors


def _train(overrides: list[str]) -> int:
    """Preemption-safe from the first moment: SIGTERM / SIGUSR1 at any point (imports, config, model
    build, resume load, warm-up, W&B init, training) ends the run with exit status 75 and one line,
    after a checkpoint of whatever no checkpoint holds yet; the SLURM batch script then requeues."""
    from nemo_azr.trainer.preemption import EXIT_PREEMPTED, Preempted, PreemptionFlag, report_ready

    flag = PreemptionFlag()
    flag.install()  # before the heavy imports: until now a signal had its default action (death)
    report_ready()  # the batch script forwards signals from now on (it held them until here)
    trainer = None
    try:
        with flag.phase("start-up", interruptible=True):
            from nemo_azr.preflight import load_config
            from nemo_azr.trainer.trainer import Trainer

            cfg = load_config(overrides)
            trainer = Trainer(cfg, preemption=flag)  # "model build": a signal stops it at once
        return _fit_and_report(cfg, trainer)
    except Preempted as exc:  # nothing unsaved yet
        _rank0_print(f"nemo-azr: {exc}: nothing to save yet, exiting for requeue", file=sys.stderr)
        return EXIT_PREEMPTED
    except NemoAzrError:
        raise
    except Exception as exc:
        lost = _peer_lost(exc, trainer)
        if lost is not None:
            raise lost from None
        if not flag.requested:
            raise
        # Failing after a preemption signal (a peer rank that already exited, a service killed with
        # the job): requeue; the next start resumes from the newest checkpoint.
        _rank0_print(
            f"nemo-azr: {flag.describe()}, then {type(exc).__name__}: "
            f"{(str(exc).strip().splitlines() or [''])[0]}; exiting for requeue",
            file=sys.stderr,
        )
        return EXIT_PREEMPTED
    finally:
        if not flag.requested:  # when exiting for requeue, a second signal (e.g. srun's copy) is ignored
            flag.uninstall()


def _peer_lost(exc: Exception, trainer):
    """The one-line :class:`PeerLostError` when ``exc`` is a collective whose peers are gone (the
    batch script is told, to requeue), else None."""
    from nemo_azr.distributed.peer_loss import peer_lost_error
    from nemo_azr.trainer.preemption import note_peer_lost

    step = trainer.state.step if trainer is not None else 0
    latest = trainer.checkpointer.latest() if trainer is not None else None
    lost = peer_lost_error(exc, step=step, checkpoint=str(latest) if latest else None)
    if lost is not None:
        note_peer_lost(str(lost))
    return lost


def _rank0_print(*args, **kwargs) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)


def _fit_and_report(cfg, trainer) -> int:
    from nemo_azr.trainer.preemption import EXIT_PREEMPTED

    result = trainer.fit()
    summary = ", ".join(
        f"{k}={result.last_metrics[k]:.4g}"
        for k in ("reward/mean", "actor/pg_loss")
        if k in result.last_metrics
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun, one summary line (rank 0 owns the checkpoint)
        pass
    elif result.status == "completed" and not result.last_metrics:  # resumed at trainer.max_steps
        print(
            f"nothing to train: {result.checkpoint} already reached trainer.max_steps={cfg.trainer.max_steps}. "
            "Raise trainer.max_steps to train on, or start over with trainer.resume=never "
            f"(overwrites {cfg.trainer.output_dir}) or another trainer.output_dir"
        )
    else:
        parts = [f"{result.status} at step {result.step}", summary, f"checkpoint: {result.checkpoint}"]
        print("; ".join(p for p in parts if p))
    # 75 tells the SLURM batch script "checkpoint written, continue me" (requeue or next chain link).
    return EXIT_PREEMPTED if result.status in ("preempted", "paused") else 0


def _show_config(overrides: list[str]) -> int:
    from nemo_azr.config.loader import to_yaml
    from nemo_azr.preflight import load_config

    print(to_yaml(load_config(overrides)), end="")
    return 0


def _make_tiny_model(overrides: list[str]) -> int:
    from nemo_azr.models.tiny import ensure_tiny_model
    from nemo_azr.preflight import load_config

    cfg = load_config(overrides)
    print(ensure_tiny_model(cfg.model.tiny))
    return 0


def _per_kind(result: dict) -> str:
    """ " (addition 0.5, subtraction 0.1)" for an accuracy eval with kinds, " (AUROC within a kind:
    pair_lookup 0.62, ...)" for an RLCR eval with kinds (then "; expected: pair_lookup 0.73, ..."
    where the expected confidence was read); "" otherwise."""
    kinds = result.get("by_kind") or {}
    blocks = [v for v in kinds.values() if isinstance(v, dict)]
    if not kinds or len(blocks) != len(kinds):
        return ""
    if all("accuracy" in v for v in blocks):
        return " (" + ", ".join(f"{k} {v['accuracy']:.4g}" for k, v in kinds.items()) + ")"
    if all("auroc" in v for v in blocks):
        shown = ", ".join(
            f"{k} {'n/a' if v['auroc'] is None else format(v['auroc'], '.3g')}{_parsed_share(v)}"
            for k, v in kinds.items()
        )
        # an enumerated evaluation also reads the mean over the candidates, which can rank answers
        # where the written (likeliest) value is one number for all of them (decision 227)
        if all(v.get("expected_auroc") is not None for v in blocks):
            shown += "; expected: " + ", ".join(f"{k} {v['expected_auroc']:.3g}" for k, v in kinds.items())
        return f" (AUROC within a kind: {shown})"
    return ""


def _parsed_share(block: dict) -> str:
    """ " over 6 of 145" where only some answers' confidences parsed: an AUROC over the few a
    broken format leaves is not the kind's."""
    n, answers = block.get("n"), block.get("num_answers")
    return (
        f" over {n} of {answers}" if isinstance(n, int) and isinstance(answers, int) and n < answers else ""
    )


def _eval(overrides: list[str]) -> int:
    from nemo_azr.evaluation.run import run_eval
    from nemo_azr.preflight import load_config

    # an evaluation generates from the checkpoint and never reads a preference run's pairs: they need
    # not exist (the pairs file of a DPO experiment may not be sampled yet)
    result = run_eval(load_config([*overrides, "preference.loss="]))
    keys = (
        "harm_reward",
        "safety",
        "completion",
        "proposer_parse_rate",
        "proposer_learnable_ratio",
        "accuracy",
        "answer_accuracy",
        "ece",
        "brier",
        "auroc",
        "mean_confidence",
        "generated_tokens_per_s",
    )
    summary = ", ".join(
        f"{k}={result[k]:.4g}" if isinstance(result[k], float) else f"{k}={result[k]}"
        for k in keys
        if k in result
    )
    if result.get("confidence_parse_fail_rate"):  # calibration is over the parsed confidences only
        summary += f", confidence_parse_fail_rate={result['confidence_parse_fail_rate']:.4g}"
    summary += _per_kind(result)
    rephrased = result.get("rephrased")
    if rephrased and rephrased.get("accuracy") is not None:
        summary += f"; rephrased accuracy={rephrased['accuracy']:.4g}"
        if "by_kind" in rephrased:
            summary += (
                " (" + ", ".join(f"{k} {v['accuracy']:.4g}" for k, v in rephrased["by_kind"].items()) + ")"
            )
    print(
        f"eval of {result['checkpoint']} on {result['num_prompts']} prompts: {summary}; written to {result['output_dir']}"
    )
    return 0


def _plot_selfplay(overrides: list[str]) -> int:
    from pathlib import Path

    from nemo_azr.preflight import load_config
    from nemo_azr.selfplay.plot import plot_selfplay

    out = Path(load_config(overrides).trainer.output_dir)
    series = plot_selfplay(out / "metrics.jsonl", out / "selfplay.png")
    for key, points in series.items():
        if points:
            first, last = points[0], points[-1]
            print(
                f"{key}: step {first[0]} {first[1]:.3f} -> step {last[0]} {last[1]:.3f} ({len(points)} steps)"
            )
    print(f"plot: {out / 'selfplay.png'}")
    return 0


def _train_rm(overrides: list[str]) -> int:
    from nemo_azr.preflight import load_config
    from nemo_azr.trainer.reward_model_training import train_reward_model

    # reward_model.path is what the RL run will read; train-rm writes it, so it need not exist yet
    train_reward_model(
        load_config([*overrides, "reward_model.path="]), progress=lambda m: print(m, flush=True)
    )
    return 0


def _sample_pairs(overrides: list[str]) -> int:
    from nemo_azr.evaluation.pair_sampling import sample_pairs
    from nemo_azr.preflight import load_config

    # the replies are scored by the task's rule; a reward model the run names (perhaps one these pairs
    # will train) is not read, nor are the pairs a DPO run trains on (perhaps these), so neither need
    # exist yet
    sample_pairs(
        load_config([*overrides, "reward_model.path=", "preference.loss="]),
        progress=lambda m: print(m, flush=True),
    )
    return 0


CONVERT_USAGE = (
    "usage: nemo-azr convert {hf-to-megatron,megatron-to-hf} SRC OUT [overrides...] "
    "(overrides pick the layout, e.g. parallel=tp2pp1 under torchrun)"
)


def _convert(args: list[str]) -> int:
    from pathlib import Path

    from nemo_azr.errors import ConfigError
    from nemo_azr.models.megatron.convert import hf_to_megatron_checkpoint, megatron_to_hf_checkpoint
    from nemo_azr.preflight import load_config

    directions = {"hf-to-megatron": hf_to_megatron_checkpoint, "megatron-to-hf": megatron_to_hf_checkpoint}
    if len(args) < 3 or args[0] not in directions or any("=" in a for a in args[:3]):
        raise ConfigError(CONVERT_USAGE)
    src, out = Path(args[1]).expanduser(), Path(args[2]).expanduser()
    cfg = load_config(["model.backend=megatron", f"model.path={src}", *args[3:]])
    written = directions[args[0]](src, out, cfg)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{args[0]}: {src} -> {written}")
    return 0


def _import_model(args: list[str]) -> int:
    from pathlib import Path

    from nemo_azr.errors import ConfigError
    from nemo_azr.models.importer import DTYPES, PRESETS, import_model

    parser = argparse.ArgumentParser(
        prog="nemo-azr import-model",
        description="Import a GGUF file, an HF model folder or a named preset as a plain HF safetensors "
        "folder (+ tokenizer) the trainer reads with model.path=<folder or preset>.",
        epilog="presets: " + "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values()),
    )
    parser.add_argument("source", help=f"a preset ({', '.join(PRESETS)}), a .gguf file or an HF folder")
    parser.add_argument("--out", type=Path, help="output folder (default for a preset: the model cache)")
    parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="weights as saved (default float32)"
    )
    parser.add_argument("--force", action="store_true", help="re-import over an existing import")
    try:
        opts = parser.parse_args(args)
    except SystemExit as exc:  # argparse printed its usage line; keep the CLI's exit status
        if exc.code:
            raise ConfigError("import-model: bad arguments (see usage above)") from None
        return 0
    folder = import_model(
        opts.source, opts.out, dtype=opts.dtype, force=opts.force, progress=lambda m: print(m, flush=True)
    )
    print(folder)
    return 0


COMMANDS = {
    "train": (_train, "run RL training (default: tiny model, arithmetic, CPU)"),
    "eval": (
        _eval,
        "score a checkpoint on the held-out split (greedy): accuracy; RLCR also ECE/Brier/AUROC + reliability diagram",
    ),
    "train-rm": (
        _train_rm,
        "train a reward model on preference pairs (Bradley-Terry; held-out accuracy) for reward_model.path",
    ),
    "sample-pairs": (
        _sample_pairs,
        "preference pairs from the policy's own replies ranked by the task's rule (JSONL for train-rm / DPO)",
    ),
    "plot-selfplay": (
        _plot_selfplay,
        "plot learnable ratio and proposer reward of a self-play run (<output_dir>/selfplay.png)",
    ),
    "convert": (_convert, "HF <-> megatron checkpoints: convert {hf-to-megatron,megatron-to-hf} SRC OUT"),
    "import-model": (
        _import_model,
        "GGUF / HF folder / preset (smollm2-135m) -> HF safetensors folder: import-model SRC [--out DIR]",
    ),
    "show-config": (_show_config, "print the composed, validated config"),
    "make-tiny-model": (
        _make_tiny_model,
        "build (or find) the cached tiny model + tokenizer, print its folder",
    ),
}


TAKES_CONFIG = (
    "train",
    "eval",
    "train-rm",
    "sample-pairs",
    "show-config",
    "plot-selfplay",
)  # commands whose overrides compose the config


def _wants_help(argv: list[str], name: str) -> bool:
    return bool(argv) and argv[0] == name and any(a in ("-h", "--help") for a in argv[1:])


def _groups_help() -> str:
    from nemo_azr.config.loader import config_groups_help

    return config_groups_help()


OWN_FLAGS = ("import-model",)  # commands with --flags of their own instead of Hydra overrides


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in OWN_FLAGS:  # its own parser (argparse would take `--help` for the top level)
        return _run(COMMANDS[argv[0]][0], argv[1:])
    parser = argparse.ArgumentParser(
        prog="nemo-azr",
        description="RL trainer for LLMs. Arguments after the command are Hydra overrides, "
        "e.g. `nemo-azr train algorithm=rloo trainer.max_steps=50`.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_fn, help_text) in COMMANDS.items():
        groups = name in TAKES_CONFIG
        p = sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog=_groups_help() if groups and _wants_help(argv, name) else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("overrides", nargs="*", help="Hydra overrides key=value")
    args = parser.parse_args(argv)
    return _run(COMMANDS[args.command][0], args.overrides)


def entry() -> None:
    """The process entry point (the ``nemo-azr`` script and ``python -m nemo_azr``); ``main`` is the
    in-process one (it returns the status)."""
    exit_process(main())


def exit_process(code: int) -> None:
    """End the process with ``code``; after a preemption checkpoint (75) or lost peers (76) without
    the interpreter's teardown.

    After 75 the checkpoint is written and every sink closed (``Trainer.fit``'s finally); what remains
    is teardown, where a library's native thread can abort the process (seen with W&B's service
    killed by the same SIGTERM: "terminate called without an active exception") and turn the status
    the SLURM script requeues on into a SIGABRT. After 76 the process group's teardown would wait on
    the lost ranks."""
    from nemo_azr.errors import EXIT_PEER_LOST
    from nemo_azr.trainer.preemption import EXIT_PREEMPTED

    if code in (EXIT_PREEMPTED, EXIT_PEER_LOST):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


def _run(fn, args: list[str]) -> int:
    return run_reporting_errors("nemo-azr", fn, args)


if __name__ == "__main__":
    entry()
