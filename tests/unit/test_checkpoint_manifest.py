"""The COMPLETE manifest (sizes + SHA-256) and resume planning over damaged checkpoints."""

import hashlib
import json
from pathlib import Path

import pytest

from nemo_azr.errors import CheckpointDamagedError, CheckpointError
from nemo_azr.trainer.checkpoint import (
    COMPLETE_MARKER,
    Checkpointer,
    plan_resume,
    verify_checkpoint,
)


def _write(folder: Path) -> None:
    (folder / "weights.bin").write_bytes(bytes(range(256)) * 40)
    (folder / "sub").mkdir()
    (folder / "sub" / "state.json").write_text('{"step": 1}')


def _saved(tmp_path, *steps):
    ck = Checkpointer(tmp_path)
    return [ck.save(step, _write) for step in steps]


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_manifest_lists_every_file_with_size_and_sha256(tmp_path):
    (folder,) = _saved(tmp_path, 3)
    manifest = json.loads((folder / COMPLETE_MARKER).read_text())
    assert manifest["step"] == 3 and manifest["version"] == 2 and manifest["hash"] == "sha256"
    assert sorted(manifest["files"]) == ["sub/state.json", "weights.bin"]
    entry = manifest["files"]["weights.bin"]
    data = (folder / "weights.bin").read_bytes()
    assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert verify_checkpoint(folder) is None


def _flip(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: _flip(f / "weights.bin"), "weights.bin has changed since the save (sha256 mismatch)"),
        (
            lambda f: (f / "weights.bin").write_bytes((f / "weights.bin").read_bytes()[:1000]),
            "weights.bin is truncated (1000 of 10240 bytes)",
        ),
        (lambda f: (f / "sub" / "state.json").write_text(""), "sub/state.json is truncated (0 of 11 bytes)"),
        (lambda f: (f / "sub" / "state.json").unlink(), "sub/state.json is missing"),
        (
            lambda f: (f / "sub" / "state.json").write_text('{"step": 1}  '),
            "sub/state.json has 13 bytes, the manifest says 11",
        ),
        (
            lambda f: (f / COMPLETE_MARKER).write_text('{"step": 3, "fi'),
            "COMPLETE (the manifest) is unreadable",
        ),
        (lambda f: (f / COMPLETE_MARKER).write_text("[]"), "COMPLETE is not a checkpoint manifest"),
        (
            lambda f: (f / COMPLETE_MARKER).write_text('{"step": 3, "files": {"weights.bin": 5}}'),
            "COMPLETE is not a checkpoint manifest",
        ),
        (
            lambda f: (f / COMPLETE_MARKER).write_text('{"step": 7, "files": {}}'),
            "COMPLETE says step 7, the folder is step_3",
        ),
    ],
    ids=[
        "flipped",
        "truncated",
        "emptied",
        "missing",
        "grown",
        "bad-json",
        "not-a-dict",
        "bad-entry",
        "step",
    ],
)
def test_verify_names_the_file_and_the_damage(tmp_path, damage, message):
    (folder,) = _saved(tmp_path, 3)
    damage(folder)
    with pytest.raises(CheckpointDamagedError) as info:
        verify_checkpoint(folder)
    assert _one_line(info).startswith(f"checkpoint {folder} is damaged: {message}")


def test_an_extra_file_is_not_damage(tmp_path):
    (folder,) = _saved(tmp_path, 3)
    (folder / "notes.txt").write_text("garbage")
    (folder / "sub" / "junk.bin").write_bytes(b"\0" * 10)
    assert verify_checkpoint(folder) is None


def test_legacy_checkpoint_without_checksums_is_accepted_with_a_warning(tmp_path):
    (folder,) = _saved(tmp_path, 3)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"step": 3, "files": ["sub/state.json", "weights.bin"]}))
    warning = verify_checkpoint(folder)
    assert warning == (
        f"checkpoint {folder} has no checksums (saved before checkpoint manifests): loading it unverified"
    )
    assert plan_resume("auto", tmp_path).notes == [warning]
    (folder / "weights.bin").unlink()  # what it does list must still be there
    with pytest.raises(CheckpointDamagedError, match="weights.bin is missing"):
        verify_checkpoint(folder)


def test_auto_falls_back_to_the_newest_intact_checkpoint(tmp_path):
    s1, s2, s3 = _saved(tmp_path, 1, 2, 3)
    assert plan_resume("auto", tmp_path).folder == s3
    _flip(s3 / "weights.bin")
    plan = plan_resume("auto", tmp_path)
    assert plan.folder == s2 and plan.skipped == [s3]
    assert plan.notes == [
        "resume: damaged checkpoint skipped: step_3 (weights.bin has changed since the save (sha256 mismatch)); "
        "falling back to step_2"
    ]
    (s2 / "sub" / "state.json").unlink()
    plan = plan_resume("auto", tmp_path)
    assert plan.folder == s1 and plan.skipped == [s3, s2]
    assert (
        "step_3 (weights.bin has changed" in plan.notes[0]
        and "step_2 (sub/state.json is missing)" in plan.notes[0]
    )
    (s1 / "weights.bin").write_bytes(b"")
    with pytest.raises(CheckpointDamagedError) as info:
        plan_resume("auto", tmp_path)
    assert _one_line(info).startswith(
        f"trainer.resume=auto: every checkpoint in {tmp_path} is damaged: step_3 ("
    )
    assert "move them aside to start over" in str(info.value)


def test_an_explicit_damaged_checkpoint_is_an_error(tmp_path):
    s1, s2 = _saved(tmp_path, 1, 2)
    (s1 / "weights.bin").write_bytes(b"x")
    with pytest.raises(CheckpointDamagedError) as info:
        plan_resume(str(s1), tmp_path)
    assert _one_line(info) == (
        f"trainer.resume: checkpoint {s1} is damaged: weights.bin is truncated (1 of 10240 bytes)"
    )
    assert isinstance(info.value, CheckpointError)
    plan = plan_resume(str(s2), tmp_path)
    assert plan.folder == s2 and plan.skipped == [] and plan.notes == []
    assert plan_resume("never", tmp_path).folder is None
