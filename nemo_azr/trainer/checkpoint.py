"""Atomic ``step_N/`` checkpoints.

A checkpoint is written into a hidden temp folder, every file is fsynced, a ``COMPLETE`` marker is
written last, and only then is the folder renamed to ``step_N`` (rename is atomic on POSIX). A
process killed at any point leaves at most a temp folder, which :meth:`Checkpointer.latest`
never returns and the next save removes.

``COMPLETE`` is also the checkpoint's manifest: every file's relative path, size and SHA-256.
:func:`verify_checkpoint` checks a folder against it before a resume, so bytes damaged after the
save (a flipped bit, a truncated or deleted file) are found before they are loaded, and
``trainer.resume=auto`` falls back to the newest intact checkpoint (:func:`plan_resume`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nemo_azr.errors import CheckpointDamagedError, CheckpointError
from nemo_azr.utils.atomic_io import fsync_dir

CHECKPOINT_DIR = "checkpoints"  # under trainer.output_dir: the step_<N> folders
COMPLETE_MARKER = "COMPLETE"
TMP_PREFIX = ".tmp-"
_STEP_RE = re.compile(r"^step_(\d+)$")
MANIFEST_VERSION = 2  # 1: COMPLETE held {"step", "files": [paths]} (no sizes, no checksums)
HASH_NAME = "sha256"  # hardware-accelerated (SHA-NI, ARMv8): ~1.1 GB/s here vs ~0.65 for blake2b
_READ_CHUNK = 4 * 2**20


def file_digest(path: Path, hash_name: str = HASH_NAME) -> str:
    """The hex digest (SHA-256 by default) of a file, read in 4 MiB chunks."""
    digest = hashlib.new(hash_name)
    buf = bytearray(_READ_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def build_manifest(folder: Path, step: int) -> dict:
    """The ``COMPLETE`` contents for ``folder``: every file's size and checksum, by relative path."""
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != COMPLETE_MARKER:
            files[p.relative_to(folder).as_posix()] = {"size": p.stat().st_size, HASH_NAME: file_digest(p)}
    return {"step": step, "version": MANIFEST_VERSION, "hash": HASH_NAME, "files": files}


def _describe_size(rel: str, actual: int, expected: int) -> str:
    if actual < expected:
        return f"{rel} is truncated ({actual} of {expected} bytes)"
    return f"{rel} has {actual} bytes, the manifest says {expected}"


def verify_checkpoint(folder: Path) -> str | None:
    """Check ``folder`` against the manifest in its ``COMPLETE`` marker.

    Returns None when every listed file is present with its size and checksum, or a one-line
    warning for a checkpoint written before manifests (only the presence of its files is checked).
    Raises :class:`CheckpointDamagedError` whose one-line message names each bad file and what is
    wrong with it (``.problems`` holds that part alone). Files the manifest does not list are ignored.
    """
    folder = Path(folder)
    try:
        manifest = json.loads((folder / COMPLETE_MARKER).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _damaged(
            folder, [f"{COMPLETE_MARKER} (the manifest) is unreadable ({_first_line(exc)})"]
        ) from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, (list, dict)):
        raise _damaged(folder, [f"{COMPLETE_MARKER} is not a checkpoint manifest"])
    step = manifest.get("step")
    if _STEP_RE.match(folder.name) and step != checkpoint_step(folder):
        raise _damaged(folder, [f"{COMPLETE_MARKER} says step {step}, the folder is {folder.name}"])
    if isinstance(files, list):  # version 1: a file list only
        missing = [f"{rel} is missing" for rel in files if not (folder / rel).is_file()]
        if missing:
            raise _damaged(folder, missing)
        return (
            f"checkpoint {folder} has no checksums (saved before checkpoint manifests): loading it unverified"
        )
    hash_name = manifest.get("hash", HASH_NAME)
    try:
        expected = {rel: (int(e["size"]), str(e[hash_name])) for rel, e in files.items()}
        hashlib.new(hash_name)
    except (KeyError, TypeError, ValueError):
        raise _damaged(folder, [f"{COMPLETE_MARKER} is not a checkpoint manifest"]) from None
    problems = []
    for rel, (size, _digest) in expected.items():
        path = folder / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != size:
            problems.append(_describe_size(rel, path.stat().st_size, size))
    if not problems:  # sizes agree: now read every byte
        for rel, (_size, digest) in expected.items():
            try:
                if file_digest(folder / rel, hash_name) != digest:
                    problems.append(f"{rel} has changed since the save ({hash_name} mismatch)")
            except OSError as exc:
                problems.append(f"{rel} is unreadable ({exc.strerror or exc})")
    if problems:
        raise _damaged(folder, problems)
    return None


def _damaged(folder: Path, problems: list[str]) -> CheckpointDamagedError:
    exc = CheckpointDamagedError(f"checkpoint {folder} is damaged: {'; '.join(problems)}")
    exc.problems = "; ".join(problems)
    return exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _fsync_tree(folder: Path) -> None:
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(Path(root))


def is_complete(folder: Path) -> bool:
    return _STEP_RE.match(folder.name) is not None and (folder / COMPLETE_MARKER).is_file()


def checkpoint_step(folder: Path) -> int:
    m = _STEP_RE.match(folder.name)
    if m is None:
        raise CheckpointError(f"{folder} is not a step_N checkpoint folder")
    return int(m.group(1))


class Checkpointer:
    def __init__(self, root: str | Path, *, keep_last: int = 0) -> None:
        self.root = Path(root)
        self.keep_last = keep_last

    def complete_checkpoints(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.is_dir() and is_complete(p)]
        return sorted(found, key=checkpoint_step)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        done = self.complete_checkpoints()
        return done[-1] if done else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Call ``write(tmp_folder)`` then publish it atomically as ``step_<step>``."""
        tmp = self.begin(step)
        try:
            write(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return self.publish(tmp, step)

    def begin(self, step: int) -> Path:
        """A fresh temp folder for checkpoint ``step`` (stale temps of killed saves are removed).

        With an asynchronous save, :meth:`publish` is called once the background writes are done;
        no other save may begin in between (the trainer finalizes the previous one first).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_stale_temps()
        tmp = self.root / f"{TMP_PREFIX}step_{step}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        return tmp

    def publish(self, tmp: Path, step: int) -> Path:
        """Fsync ``tmp``, write its manifest (sizes, checksums) as the ``COMPLETE`` marker, rename it
        to ``step_<step>``; prune old ones. The asynchronous megatron save calls this from its
        finalize step (``on_written``), once every rank's shards are written."""
        try:
            _fsync_tree(tmp)
            manifest = build_manifest(tmp, step)
            with open(tmp / COMPLETE_MARKER, "w") as fh:
                json.dump(manifest, fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            fsync_dir(tmp)
            final = self.root / f"step_{step}"
            if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside first
                old = self.root / f"{TMP_PREFIX}old-{final.name}-{uuid.uuid4().hex[:8]}"
                os.rename(final, old)
                shutil.rmtree(old, ignore_errors=True)
            os.rename(tmp, final)
            fsync_dir(self.root)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _remove_stale_temps(self) -> None:
        for p in self.root.iterdir():
            if p.name.startswith(TMP_PREFIX) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` RL checkpoints. ``step_0`` is only ever the supervised
        warm-up's (``sft_warmup.save``), the RL start point a before/after evaluation reads, so the
        rotation never removes it (nor counts it)."""
        if self.keep_last <= 0:
            return
        rotated = [p for p in self.complete_checkpoints() if checkpoint_step(p) != 0]
        for old in rotated[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


@dataclass
class ResumePlan:
    """What :func:`plan_resume` chose: the folder to load (None: start fresh), the damaged
    checkpoints skipped on the way (``trainer.resume=auto``) and one-line notes for the log."""

    folder: Path | None
    skipped: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def plan_resume(resume: str, root: Path) -> ResumePlan:
    """``never`` -> fresh; ``auto`` -> the newest complete checkpoint under ``root`` that passes
    :func:`verify_checkpoint` (damaged ones are skipped and reported); else a path, which must be
    a complete, intact checkpoint (:class:`CheckpointError` / :class:`CheckpointDamagedError`)."""
    if resume == "never":
        return ResumePlan(None)
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise CheckpointError(f"trainer.resume={resume!r}: no such checkpoint folder")
        if not is_complete(path):
            raise CheckpointError(
                f"trainer.resume={resume!r} is not a complete step_N checkpoint (no {COMPLETE_MARKER})"
            )
        try:
            warning = verify_checkpoint(path)
        except CheckpointDamagedError as exc:
            raise CheckpointDamagedError(f"trainer.resume: {exc}") from None
        return ResumePlan(path, notes=[warning] if warning else [])
    plan = ResumePlan(None)
    reasons = []
    for folder in reversed(_step_folders(root)):
        if not is_complete(folder):  # published folders always hold it: deleted or damaged since
            plan.skipped.append(folder)
            reasons.append(f"{folder.name} (its {COMPLETE_MARKER} marker is missing)")
            continue
        try:
            warning = verify_checkpoint(folder)
        except CheckpointDamagedError as exc:
            plan.skipped.append(folder)
            reasons.append(f"{folder.name} ({exc.problems})")
            continue
        plan.folder = folder
        if warning:
            plan.notes.append(warning)
        break
    if plan.skipped and plan.folder is None:
        raise CheckpointDamagedError(
            f"trainer.resume=auto: every checkpoint in {root} is damaged: {' | '.join(reasons)}; "
            "move them aside to start over"
        )
    if plan.skipped:
        plan.notes.insert(
            0,
            f"resume: damaged checkpoint skipped: {' | '.join(reasons)}; falling back to {plan.folder.name}",
        )
    return plan


def _step_folders(root: Path) -> list[Path]:
    """Every ``step_<N>`` folder under ``root``, complete or not, oldest first."""
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if p.is_dir() and _STEP_RE.match(p.name)), key=checkpoint_step)


def resolve_resume(resume: str, root: Path) -> Path | None:
    """The folder :func:`plan_resume` chooses (None: start fresh)."""
    return plan_resume(resume, root).folder
