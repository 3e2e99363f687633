"""Kill -9 / resume soak of the default tiny job (``scripts/soak.sh`` runs this).

One uninterrupted reference run first. Then episodes, each in a fresh output folder: start
``python -m nemo_azr train`` with the same overrides, ``kill -9`` it (its own process group only) at
a random point, resume, and again, until a launch completes; the episode's ``metrics.jsonl``
(machine-dependent metrics dropped), ``samples.jsonl`` and final checkpoint (model weights,
optimizer and scheduler state) must equal the reference bit for bit. A killed launch is one
*cycle*; episodes continue until ``--cycles`` cycles have run, then the last one finishes.

Kill modes: ``start-up`` (uniform over the reference run's start-up: imports, model build, checkpoint
verification and load, or the warm-up), ``training`` (uniform over the reference run's training time,
counted from the line that says the launch resumed) and ``save`` (watch for the checkpoint temp
folder and kill 0-40 ms after it appears: while writing, fsyncing, hashing or publishing). Each kill
is classified from what is on disk at that moment. After some kills the newest checkpoint is damaged (flipped bytes in the weights, a truncated
optimizer / rng / trainer-state file, a deleted file, or an extra garbage file, which is no damage);
the next launch must report the damaged one in one line and fall back to the newest intact one
(the extra file: resume from it as usual). That launch is killed only after it resumed.

Second writers (``--second-writer-prob``): before some launches are killed, a second run with another
seed is started on the same folder while the first holds its lock. The first is stopped (SIGSTOP)
from the moment its lock names it until the second has exited, so the test does not depend on which
of the two reaches a file first: the second must exit 2 with one line naming the first's pid, and
leave every file of the folder as it was. The first then goes on (SIGCONT) and its episode must still
equal the reference.

Writes ``<out>/soak.json`` and, with ``--results``, ``<results>.json`` and ``<results>.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import cpu_model  # noqa: E402

from nemo_azr.trainer.checkpoint import COMPLETE_MARKER, TMP_PREFIX, file_digest, verify_checkpoint  # noqa: E402
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics  # noqa: E402
from nemo_azr.trainer.output_lock import LOCK_FILE  # noqa: E402

DAMAGE_KINDS = (
    "flip-weights",
    "truncate-optimizer",
    "truncate-rng",
    "truncate-trainer-state",
    "delete-file",
    "extra-file",
)


def overrides(out: Path, args) -> list[str]:
    cache = [f"model.tiny.cache_dir={args.cache_dir}"] if args.cache_dir else []
    return [
        *cache,
        "logger=quiet",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={args.steps}",
        f"trainer.save_interval={args.save_interval}",
        "trainer.keep_last=2",
        f"trainer.num_threads={args.threads}",
        f"sft_warmup.steps={args.warmup}",
        "data.prompts_per_step=4",
        "generation.n_samples=4",
        *(ASYNC_OVERRIDES if args.async_rollout else []),
    ]


#: ``--async``: rollouts one step ahead in a thread, corrected by truncated importance weights; a
#: checkpoint then carries the batches sampled ahead (decision 155).
ASYNC_OVERRIDES = (
    "rollout.async_rollout=true",
    "rollout.max_policy_lag=1",
    "algorithm.off_policy_correction=tis",
    "algorithm.is_cap=2.0",
)


def _env() -> dict:
    env = dict(os.environ)
    env.update(WANDB_MODE="disabled", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


class Launch:
    """One ``python -m nemo_azr train`` in its own process group, stdout/stderr to files."""

    def __init__(
        self, out: Path, args, index: int, extra: tuple[str, ...] = (), kind: str = "launch"
    ) -> None:
        self.out = out
        self.log = out.parent / f"{out.name}.{kind}{index:03d}.log"
        self.fh = open(self.log, "w")  # noqa: SIM115 - closed in wait()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nemo_azr", "train", *overrides(out, args), *extra],
            stdout=self.fh,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=_env(),
            start_new_session=True,  # its own process group: we kill it and its children only
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def running(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def resumed(self) -> bool:
        text = self.text()
        return "resumed from " in text or "supervised warm-up:" in text

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # it may have just exited
            os.killpg(self.proc.pid, sig)  # this launch's own group (start_new_session)

    def wait(self) -> int:
        rc = self.proc.wait()
        self.fh.close()
        return rc


def lock_holder_pid(out: Path) -> int | None:
    """The pid the folder's lock file names (the run holding it, or one that died holding it)."""
    try:
        return int(json.loads((out / LOCK_FILE).read_text()).get("pid"))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def folder_state(out: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``out``: (size, mtime in ns)."""
    stats = {str(p.relative_to(out)): p.stat() for p in out.rglob("*") if p.is_file()}
    return {name: (st.st_size, st.st_mtime_ns) for name, st in stats.items()}


def second_writer(first: Launch, out: Path, args, index: int) -> dict:
    """Start a second run (another seed) on ``first``'s folder while ``first`` holds the lock and is
    stopped; it must refuse in one line naming ``first`` and change nothing. Returns the record."""
    while first.running() and lock_holder_pid(out) != first.proc.pid:
        time.sleep(0.005)
    if not first.running():
        return {"probed": False}
    first.signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    try:
        before = folder_state(out)
        second = Launch(out, args, index, ("seed=1",), kind="second")
        rc = second.wait()
        text = second.text()
        after = folder_state(out)
    finally:
        first.signal(signal.SIGCONT)
    first.t0 += time.monotonic() - paused_at  # the kill delays count the first run's own time
    named = f"is in use by another training run (pid {first.proc.pid} on host"
    lines = [line for line in text.splitlines() if line.strip()]
    record = {
        "probed": True,
        "rc": rc,
        "named_first": any(named in line for line in lines),
        "lines": len(lines),
        "unchanged": before == after,
        "line": next((line for line in lines if named in line), lines[-1] if lines else ""),
    }
    record["ok"] = rc == 2 and record["named_first"] and record["unchanged"] and len(lines) == 1
    return record


def checkpoints(out: Path) -> Path:
    return out / "checkpoints"


def complete(out: Path) -> list[Path]:
    root = checkpoints(out)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.name.startswith("step_") and (p / COMPLETE_MARKER).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def temp_folders(out: Path) -> list[Path]:
    root = checkpoints(out)
    return [p for p in root.iterdir() if p.name.startswith(TMP_PREFIX)] if root.is_dir() else []


def metric_lines(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count("\n") if path.is_file() else 0


def classify(launch: Launch, out: Path, temps_before: set[str], steps: int) -> str:
    """Where the process was when killed, from the files it had written."""
    temps = [p for p in temp_folders(out) if p.name not in temps_before]
    if temps:
        if any(p.name.startswith(f"{TMP_PREFIX}old-") for p in temps):
            return "save: replacing an older copy"
        if any((p / COMPLETE_MARKER).exists() for p in temps):
            return "save: manifest written, before rename"
        return "save: writing / fsync / hashing"
    if not launch.resumed():
        return "start-up (imports, model build, verify + load, or warm-up)"
    if metric_lines(out) >= steps:
        return "after the last step (final save, exit)"
    return "training step (rollout, update, logging)"


def damage(folder: Path, kind: str, rng: random.Random) -> str:
    if kind == "flip-weights":
        path = folder / "model" / "model.safetensors"
        data = bytearray(path.read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        return f"flipped one bit at byte {pos} of model/model.safetensors"
    if kind.startswith("truncate-"):
        name = {"optimizer": "optimizer.pt", "rng": "rng.pt", "trainer-state": "trainer_state.json"}[
            kind.removeprefix("truncate-")
        ]
        path = folder / name
        keep = rng.randrange(path.stat().st_size)
        with open(path, "r+b") as fh:
            fh.truncate(keep)
        return f"truncated {name} to {keep} bytes"
    if kind == "delete-file":
        name = rng.choice(["model/config.json", "optimizer.pt", "rng.pt", "model/tokenizer.json"])
        (folder / name).unlink()
        return f"deleted {name}"
    if kind == "extra-file":
        (folder / "garbage.bin").write_bytes(os.urandom(4096))
        return "added garbage.bin (not damage: must resume from it)"
    raise ValueError(kind)


def _commit() -> str | None:
    """The code's git commit, when it runs from a checkout."""
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


def _intact(folder: Path) -> bool:
    try:
        verify_checkpoint(folder)
    except Exception:  # noqa: BLE001 - damaged (or removed meanwhile)
        return False
    return True


def _tensors_equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def compare(out: Path, ref: Path, steps: int) -> dict:
    final, ref_final = checkpoints(out) / f"step_{steps}", checkpoints(ref) / f"step_{steps}"
    weights = "model/model.safetensors"
    result = {
        "metrics_equal": without_machine_metrics(read_metrics(out / "metrics.jsonl"))
        == without_machine_metrics(read_metrics(ref / "metrics.jsonl")),
        "metric_steps": [r["step"] for r in read_metrics(out / "metrics.jsonl")] == list(range(1, steps + 1)),
        "samples_equal": read_metrics(out / "samples.jsonl") == read_metrics(ref / "samples.jsonl"),
        "weights_equal": (final / weights).is_file()
        and file_digest(final / weights) == file_digest(ref_final / weights),
        "optimizer_equal": (final / "optimizer.pt").is_file()
        and _tensors_equal(
            torch.load(final / "optimizer.pt", weights_only=False),
            torch.load(ref_final / "optimizer.pt", weights_only=False),
        ),
    }
    result["equal"] = all(result.values())
    return result


def run_reference(args, work: Path) -> tuple[Path, float, float]:
    """The uninterrupted run: its folder, its start-up time (to the warm-up line) and wall time."""
    ref = work / "reference"
    launch = Launch(ref, args, 0)
    t_startup = None
    while launch.running():
        if t_startup is None and launch.resumed():
            t_startup = launch.elapsed()
        time.sleep(0.01)
    rc = launch.wait()
    if rc != 0 or t_startup is None:
        sys.exit(f"soak: the reference run failed (exit {rc}); see {launch.log}")
    return ref, t_startup, launch.elapsed()


def soak(args) -> dict:
    rng = random.Random(args.seed)
    work = Path(args.out).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    t_start = time.monotonic()
    ref, t_startup, t_ref = run_reference(args, work)
    print(f"reference run: {t_ref:.1f} s ({t_startup:.1f} s start-up)", flush=True)
    shares = {"start-up": args.startup_share, "save": args.save_share}
    shares["training"] = 1.0 - sum(shares.values())

    cycles = 0
    launches = 0
    episodes = []
    kills = []  # one record per kill
    corruptions = []  # one record per damaged checkpoint
    failures = []
    pending = None  # the corruption the next launch must react to
    writers = []  # one record per second-writer probe
    while cycles < args.cycles or episodes == [] or not episodes[-1].get("done"):
        if not episodes or episodes[-1].get("done"):
            episodes.append({"index": len(episodes), "launches": 0, "kills": 0})
        ep = episodes[-1]
        out = work / f"episode_{ep['index']:03d}"
        launch = Launch(out, args, ep["launches"])
        launches += 1
        ep["launches"] += 1
        mode = None
        if cycles < args.cycles:
            mode = rng.choices(list(shares), weights=list(shares.values()))[0]
            if pending and mode == "start-up":  # after a corruption: kill only once it has resumed
                mode = "training"
        if cycles < args.cycles and args.second_writer_prob > 0 and rng.random() < args.second_writer_prob:
            probe = second_writer(launch, out, args, len(writers))
            if probe["probed"]:
                writers.append({"episode": ep["index"], **probe})
                if not probe["ok"]:
                    failures.append(
                        {"episode": ep["index"], "what": "second writer not refused cleanly", **probe}
                    )
        temps_before = {p.name for p in temp_folders(out)}
        # start-up: uniform over the reference's start-up; training: over its training time, counted
        # from the line that says the run resumed (or finished its warm-up).
        delay = {
            "start-up": rng.uniform(0.0, t_startup),
            "training": rng.uniform(0.0, t_ref - t_startup),
        }.get(mode)
        armed_at = None if mode == "training" else 0.0
        killed = None
        while launch.running():
            now = launch.elapsed()
            if armed_at is None and launch.resumed():
                armed_at = now
            if mode is not None and armed_at is not None:
                if mode in ("start-up", "training") and now - armed_at >= delay:
                    killed = classify(launch, out, temps_before, args.steps)
                    launch.kill()
                    break
                if mode == "save":
                    fresh = [p for p in temp_folders(out) if p.name not in temps_before]
                    if fresh:
                        time.sleep(rng.uniform(0.0, 0.04))
                        killed = classify(launch, out, temps_before, args.steps)
                        launch.kill()
                        break
            time.sleep(0.001 if mode == "save" else 0.01)
        rc = launch.wait()
        text = launch.text()
        if pending is not None:
            newest = pending["folder"]
            skipped = f"resume: damaged checkpoint skipped: {newest}"
            pending["detected"] = skipped in text
            resumed = [
                line.split("resumed from ", 1)[1] for line in text.splitlines() if "resumed from " in line
            ]
            pending["resumed_from"] = Path(resumed[0].split(" (")[0]).name if resumed else None
            if pending["kind"] == "extra-file":  # no damage: resume from it, no fallback
                pending["ok"] = not pending["detected"] and pending["resumed_from"] == newest
            else:
                pending["ok"] = pending["detected"] and pending["resumed_from"] not in (None, newest)
            pending["line"] = next((line for line in text.splitlines() if skipped in line), None)
            if not pending["ok"]:
                failures.append({"episode": ep["index"], "what": "corruption not handled", **pending})
            pending = None
        if killed is not None and rc == 0:
            killed = None  # it finished just before the kill: a completed launch
        if killed is not None:
            if rc != -signal.SIGKILL:
                failures.append(
                    {"episode": ep["index"], "what": f"killed launch exited {rc}", "log": str(launch.log)}
                )
            cycles += 1
            ep["kills"] += 1
            kills.append(
                {
                    "episode": ep["index"],
                    "mode": mode,
                    "phase": killed,
                    "at_s": round(launch.elapsed(), 3),
                    "metric_lines": metric_lines(out),
                }
            )
            done = [p for p in complete(out) if _intact(p)]
            newest = complete(out)[-1] if complete(out) else None
            # Damage the newest checkpoint when it is intact and an older intact one remains.
            if (
                args.corrupt_prob > 0
                and len(done) >= 2
                and done[-1] == newest
                and rng.random() < args.corrupt_prob
            ):
                kind = DAMAGE_KINDS[len(corruptions) % len(DAMAGE_KINDS)]  # every kind, in turn
                what = damage(done[-1], kind, rng)
                pending = {"episode": ep["index"], "kind": kind, "folder": done[-1].name, "what": what}
                corruptions.append(pending)
            print(
                f"cycle {cycles:3d}: episode {ep['index']} launch {ep['launches']} killed at "
                f"{kills[-1]['at_s']:.2f} s ({mode} kill, in {killed}; {kills[-1]['metric_lines']} steps logged)"
                + (f"; damaged {pending['folder']}: {pending['what']}" if pending else ""),
                flush=True,
            )
            continue
        if rc != 0:
            failures.append({"episode": ep["index"], "what": f"launch exited {rc}", "tail": text[-2000:]})
            ep["done"] = True
            ep["result"] = {"equal": False}
            print(f"episode {ep['index']}: launch exited {rc}, see {launch.log}", flush=True)
            continue
        ep["done"] = True
        ep["result"] = compare(out, ref, args.steps)
        ep["fallbacks"] = json.loads(
            (checkpoints(out) / f"step_{args.steps}" / "trainer_state.json").read_text()
        ).get("resume_fallbacks")
        if not ep["result"]["equal"]:
            failures.append({"episode": ep["index"], "what": "final state differs", **ep["result"]})
        print(
            f"episode {ep['index']}: completed after {ep['kills']} kills, equal={ep['result']['equal']}",
            flush=True,
        )
        if not args.keep and ep["result"]["equal"]:
            shutil.rmtree(out, ignore_errors=True)
            for log in work.glob(f"{out.name}.launch*.log"):
                log.unlink()

    wall = time.monotonic() - t_start
    verify_s = []
    final = checkpoints(ref) / f"step_{args.steps}"
    for _ in range(20):
        t = time.perf_counter()
        verify_checkpoint(final)
        verify_s.append(time.perf_counter() - t)
    handled = [c for c in corruptions if c.get("ok")]
    return {
        "config": {
            "cycles_requested": args.cycles,
            "steps": args.steps,
            "save_interval": args.save_interval,
            "keep_last": 2,
            "sft_warmup_steps": args.warmup,
            "threads": args.threads,
            "kill_shares": shares,
            "corrupt_prob": args.corrupt_prob,
            "async": args.async_rollout,
            "second_writer_prob": args.second_writer_prob,
            "seed": args.seed,
            "overrides": overrides(Path("<episode>"), args),
        },
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count()},
        "commit": _commit(),
        "cycles": cycles,
        "launches": launches,
        "episodes": len(episodes),
        "episodes_equal": sum(1 for e in episodes if e.get("result", {}).get("equal")),
        "all_equal": all(e.get("result", {}).get("equal") for e in episodes),
        "kills_per_episode": dict(sorted(Counter(e["kills"] for e in episodes).items())),
        "kill_modes": dict(Counter(k["mode"] for k in kills)),
        "kill_phases": dict(Counter(k["phase"] for k in kills).most_common()),
        "kill_steps_logged": dict(sorted(Counter(k["metric_lines"] for k in kills).items())),
        "kill_time_s": {
            "min": min((k["at_s"] for k in kills), default=0),
            "median": statistics.median([k["at_s"] for k in kills]) if kills else 0,
            "max": max((k["at_s"] for k in kills), default=0),
        },
        "corruptions": len(corruptions),
        "corruptions_by_kind": dict(Counter(c["kind"] for c in corruptions)),
        "corrupt_resumes_detected": sum(1 for c in corruptions if c.get("detected")),
        "fallbacks_expected": sum(1 for c in corruptions if c["kind"] != "extra-file"),
        "corruptions_handled": len(handled),
        "fallback_lines": [c.get("line") for c in corruptions if c.get("line")][:6],
        "resume_fallbacks_counted": sum(e.get("fallbacks") or 0 for e in episodes),
        "failures": failures,
        "reference_run_s": round(t_ref, 2),
        "reference_startup_s": round(t_startup, 2),
        "wall_s": round(wall, 1),
        "s_per_cycle": round(wall / max(cycles, 1), 2),
        "verify_tiny_checkpoint_ms": round(1000 * statistics.median(verify_s), 2),
        "tiny_checkpoint_bytes": sum(p.stat().st_size for p in final.rglob("*") if p.is_file()),
        "corruption_log": corruptions,
        "second_writers": len(writers),
        "second_writers_refused": sum(1 for w in writers if w["ok"]),
        "second_writer_lines": sorted({w["line"].split(" (pid ")[0] for w in writers})[:3],
    }


def markdown(r: dict) -> str:
    c = r["config"]
    lines = [
        "# Kill -9 / resume soak",
        "",
        "`bash scripts/soak.sh --cycles "
        f"{c['cycles_requested']} --seed {c['seed']}"
        + (" --async" if c.get("async") else "")
        + (f" --second-writer-prob {c['second_writer_prob']}" if c.get("second_writer_prob") else "")
        + "` (benchmarks/soak.py): the default tiny job "
        f"(`arithmetic_grpo`) for {c['steps']} GRPO steps after a {c['sft_warmup_steps']}-step warm-up, "
        f"a checkpoint every {c['save_interval']} steps (keep_last 2), {c['threads']} torch thread(s), "
        f"killed with SIGKILL at random points and resumed with `trainer.resume=auto`. "
        + (
            "Asynchronous rollout (`--async`: lag 1 in a thread, TIS), so checkpoints carry the "
            "batches sampled ahead. "
            if c.get("async")
            else ""
        )
        + f"Machine: {r['machine']['cpu']}, {r['machine']['cores']} cores, shared with other jobs"
        + (f"; code at commit {r['commit']}." if r.get("commit") else "."),
        "",
        "| | |",
        "| --- | --- |",
        f"| cycles (kill -9 + resume) | {r['cycles']} |",
        f"| launches / episodes | {r['launches']} / {r['episodes']} |",
        f"| episodes whose final state equals the uninterrupted run | {r['episodes_equal']} / {r['episodes']} |",
        f"| damaged checkpoints injected | {r['corruptions']} ({', '.join(f'{k} {v}' for k, v in r['corruptions_by_kind'].items())}) |",
        f"| damaged resumes detected (one line) / fallbacks expected | {r['corrupt_resumes_detected']} / {r['fallbacks_expected']} |",
        f"| corruptions handled as expected (fallback, or extra file accepted) | {r['corruptions_handled']} / {r['corruptions']} |",
        f"| `resume_fallbacks` in the final checkpoints (summed) | {r['resume_fallbacks_counted']} |",
        *(
            [
                f"| second writers started on a held folder / refused in one line naming the first, nothing changed | "
                f"{r['second_writers']} / {r['second_writers_refused']} |"
            ]
            if r.get("second_writers")
            else []
        ),
        f"| failures | {len(r['failures'])} |",
        f"| wall time | {r['wall_s']:.0f} s ({r['s_per_cycle']:.1f} s per cycle; reference run {r['reference_run_s']:.1f} s) |",
        f"| verify one tiny checkpoint ({r['tiny_checkpoint_bytes'] / 1e6:.1f} MB, warm cache) | {r['verify_tiny_checkpoint_ms']:.1f} ms |",
        "",
        "Equal means: `metrics.jsonl` record for record without the machine-dependent `timing/`, "
        "`throughput/`, `system/` metrics (`without_machine_metrics`), `samples.jsonl`, the final "
        "`model.safetensors` byte for byte, and every optimizer / scheduler tensor (`torch.equal`).",
        "",
        "## Kill points",
        "",
        "| where the process was (from the files on disk at the kill) | kills |",
        "| --- | --- |",
        *[f"| {phase} | {n} |" for phase, n in r["kill_phases"].items()],
        "",
        f"Kill modes: {', '.join(f'{k} {v}' for k, v in r['kill_modes'].items())} (`start-up`: uniform over "
        "the reference run's start-up; `training`: uniform over its training time, from the line that says "
        "the launch resumed; `save`: 0-40 ms after a checkpoint temp folder appeared). "
        f"Seconds after launch: min {r['kill_time_s']['min']:.2f}, median {r['kill_time_s']['median']:.2f}, "
        f"max {r['kill_time_s']['max']:.2f}. Steps logged at the kill: "
        + ", ".join(f"{k}: {v}" for k, v in r["kill_steps_logged"].items())
        + ". Kills per episode: "
        + ", ".join(f"{k}: {v}" for k, v in r["kills_per_episode"].items())
        + ".",
        "",
        "## Damaged checkpoints",
        "",
        "After a kill that left at least two complete checkpoints, the newest was damaged (each kind in "
        "turn); the next launch was killed only after it had resumed. `resume_fallbacks` counts the "
        "fallbacks on the way to a checkpoint's state: a fallback to a checkpoint saved before an earlier "
        "fallback does not carry that earlier count, so the final sum can be below the number of "
        "fallbacks. Example lines the launches logged:",
        "",
        "```",
        *r["fallback_lines"],
        "```",
        "",
    ]
    if r.get("second_writers"):
        lines += [
            "## Second writers",
            "",
            f"Before {r['second_writers']} of the launches were killed, a second run (seed 1) was started "
            "on the same folder as soon as the first's lock named it; the first was stopped (SIGSTOP) "
            "until the second had exited, so neither could win a race to a file. Each second run must "
            "exit 2 with one line naming the first's pid and leave every file's size and mtime as they "
            "were; the first then went on and its episode was compared with the reference like any "
            "other. The line (up to the pid):",
            "",
            "```",
            *r["second_writer_lines"],
            "```",
            "",
        ]
    if r["failures"]:
        lines += ["## Failures", "", "```", *[json.dumps(f)[:400] for f in r["failures"]], "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=50, help="kill -9 + resume cycles (default 50)")
    p.add_argument("--steps", type=int, default=16, help="GRPO steps per run (default 16)")
    p.add_argument("--save-interval", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5, help="supervised warm-up steps (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    p.add_argument("--startup-share", type=float, default=0.25, help="share of kills during start-up")
    p.add_argument("--save-share", type=float, default=0.3, help="share of kills aimed at a save")
    p.add_argument("--corrupt-prob", type=float, default=0.35, help="share of kills followed by damage")
    p.add_argument(
        "--async", dest="async_rollout", action="store_true", help="rollout.async_rollout, lag 1 + TIS"
    )
    p.add_argument(
        "--second-writer-prob",
        type=float,
        default=0.0,
        help="share of launches that face a second run (seed 1) on their folder while holding its lock",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="outputs/soak", help="work folder (deleted first)")
    p.add_argument("--results", default="", help="also write <results>.json and <results>.md")
    p.add_argument("--keep", action="store_true", help="keep every episode's folder")
    p.add_argument("--cache-dir", default="", help="model.tiny.cache_dir (default: the usual model cache)")
    args = p.parse_args(argv)
    result = soak(args)
    text = json.dumps(result, indent=1)
    (Path(args.out) / "soak.json").write_text(text)
    if args.results:
        Path(args.results + ".json").write_text(text + "\n")
        Path(args.results + ".md").write_text(markdown(result))
    print(
        f"soak: {result['cycles']} cycles, {result['episodes_equal']}/{result['episodes']} episodes equal, "
        f"{result['corruptions_handled']}/{result['corruptions']} damaged checkpoints handled, "
        f"{len(result['failures'])} failures, {result['wall_s']:.0f} s"
    )
    return 0 if result["all_equal"] and not result["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
