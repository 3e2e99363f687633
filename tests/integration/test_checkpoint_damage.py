"""Damaged checkpoints of the tiny model: each kind of damage gives one line naming the file;
``trainer.resume=auto`` falls back to the newest intact checkpoint (counted, logged once) and then
reproduces the undamaged run exactly; ``trainer.resume=PATH`` to a damaged folder exits 2."""

from __future__ import annotations

import json
import shutil

import pytest

from nemo_azr.cli import main as nemo_azr_main
from nemo_azr.trainer.checkpoint import COMPLETE_MARKER, verify_checkpoint
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics

STEPS = 4


def _overrides(tiny_cache, out, *extra):
    return [
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        f"trainer.max_steps={STEPS}",
        "trainer.save_interval=2",
        "trainer.keep_last=0",
        "sft_warmup.steps=2",
        "data.prompts_per_step=2",
        "generation.n_samples=4",
        *extra,
    ]


@pytest.fixture(scope="module")
def trained(tiny_cache, tmp_path_factory):
    """One undamaged run: checkpoints step_2 and step_4, metrics for steps 0-3."""
    out = tmp_path_factory.mktemp("damage") / "run"
    assert nemo_azr_main(["train", *_overrides(tiny_cache, out)]) == 0
    return out


def _copy(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out, out / "checkpoints" / f"step_{STEPS}"


def _flip_middle(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, in the tensor data (the header still parses)
    path.write_bytes(bytes(data))


def _truncate(path, keep=0.5):
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * keep)])


def _comparable(path):
    return without_machine_metrics(read_metrics(path))


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.strip()]


DAMAGE = {
    "flipped-weights": (
        lambda f: _flip_middle(f / "model" / "model.safetensors"),
        "model/model.safetensors has changed since the save (sha256 mismatch)",
    ),
    "truncated-optimizer": (lambda f: _truncate(f / "optimizer.pt"), "optimizer.pt is truncated ("),
    "truncated-rng": (lambda f: _truncate(f / "rng.pt"), "rng.pt is truncated ("),
    "truncated-state": (lambda f: _truncate(f / "trainer_state.json"), "trainer_state.json is truncated ("),
    "missing-file": (lambda f: (f / "model" / "config.json").unlink(), "model/config.json is missing"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_one_line_and_auto_falls_back(kind, trained, tiny_cache, tmp_path, capsys):
    out, newest = _copy(trained, tmp_path)
    damage, message = DAMAGE[kind]
    damage(newest)
    capsys.readouterr()

    # An explicit path to the damaged folder: one line, exit 2, nothing trained.
    args = ["train", *_overrides(tiny_cache, out)]
    assert nemo_azr_main([*args, f"trainer.resume={newest}"]) == 2
    captured = capsys.readouterr()
    (line,) = _errors(captured.err)
    assert line.startswith(f"nemo-azr: error: trainer.resume: checkpoint {newest} is damaged: {message}")
    assert "Traceback" not in captured.out + captured.err

    # resume=auto: skip it (one line), resume from step_2, train steps 2-3 again exactly as before.
    assert nemo_azr_main(args) == 0
    captured = capsys.readouterr()
    lines = _errors(captured.err)
    assert lines[0].startswith(f"resume: damaged checkpoint skipped: step_{STEPS} ({message}")
    assert lines[0].endswith("; falling back to step_2")
    assert lines[1] == f"resumed from {out / 'checkpoints' / 'step_2'} (step 2)"
    assert len(lines) == 2
    assert verify_checkpoint(newest) is None  # re-saved over the damaged one
    assert json.loads((newest / "trainer_state.json").read_text())["resume_fallbacks"] == 1
    assert _comparable(out / "metrics.jsonl") == _comparable(trained / "metrics.jsonl")
    weights = "model/model.safetensors"
    assert (newest / weights).read_bytes() == (
        trained / "checkpoints" / f"step_{STEPS}" / weights
    ).read_bytes()


def test_an_extra_file_is_not_damage(trained, tiny_cache, tmp_path, capsys):
    out, newest = _copy(trained, tmp_path)
    (newest / "garbage.bin").write_bytes(b"\xff" * 100)
    (newest / "model" / "notes.txt").write_text("not part of the checkpoint")
    capsys.readouterr()
    assert nemo_azr_main(["train", *_overrides(tiny_cache, out), f"trainer.resume={newest}"]) == 0
    captured = capsys.readouterr()
    assert _errors(captured.err) == [f"resumed from {newest} (step {STEPS})"]


def _legacy(folder):
    """The COMPLETE marker of checkpoints saved before manifests: a file list only."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    files.remove(COMPLETE_MARKER)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"step": STEPS, "files": files}))


LEGACY_DAMAGE = {
    "truncated-weights": (
        lambda f: _truncate(f / "model" / "model.safetensors", 0.3),
        "model/model.safetensors is unreadable (",
    ),
    "truncated-optimizer": (lambda f: _truncate(f / "optimizer.pt"), "optimizer.pt is unreadable ("),
    "truncated-rng": (lambda f: _truncate(f / "rng.pt"), "rng.pt is unreadable ("),
    "truncated-state": (lambda f: _truncate(f / "trainer_state.json"), "trainer_state.json is unreadable ("),
}


def test_legacy_checkpoint_loads_with_one_warning(trained, tiny_cache, tmp_path, capsys):
    out, newest = _copy(trained, tmp_path)
    _legacy(newest)
    capsys.readouterr()
    assert nemo_azr_main(["train", *_overrides(tiny_cache, out)]) == 0
    assert _errors(capsys.readouterr().err) == [
        f"checkpoint {newest} has no checksums (saved before checkpoint manifests): loading it unverified",
        f"resumed from {newest} (step {STEPS})",
    ]


@pytest.mark.parametrize("kind", list(LEGACY_DAMAGE))
def test_legacy_checkpoint_damage_is_one_line(kind, trained, tiny_cache, tmp_path, capsys):
    """Without checksums the damage shows only when loading: still one line naming the file."""
    out, newest = _copy(trained, tmp_path)
    _legacy(newest)
    damage, message = LEGACY_DAMAGE[kind]
    damage(newest)
    capsys.readouterr()
    assert nemo_azr_main(["train", *_overrides(tiny_cache, out)]) == 2
    captured = capsys.readouterr()
    (line,) = _errors(captured.err)
    assert line.startswith(f"nemo-azr: error: checkpoint {newest}: {message}")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("explicit", [False, True], ids=["auto", "path"])
def test_eval_of_a_damaged_checkpoint_is_one_line(explicit, trained, tiny_cache, tmp_path, capsys):
    out, newest = _copy(trained, tmp_path)
    _flip_middle(newest / "model" / "model.safetensors")
    capsys.readouterr()
    choice = [f"eval.checkpoint={newest}"] if explicit else []
    code = nemo_azr_main(["eval", *_overrides(tiny_cache, out), "data.eval_size=4", *choice])
    assert code == 2
    (line,) = _errors(capsys.readouterr().err)
    what = "eval.checkpoint: checkpoint" if explicit else "eval.checkpoint=auto: the newest checkpoint"
    assert line == (
        f"nemo-azr: error: {what} {newest} is damaged: model/model.safetensors has changed since the save "
        "(sha256 mismatch); pass an intact one as eval.checkpoint=PATH"
    )
