"""The built distribution holds what an installed nemo-azr reads: every Hydra config, the sbatch
templates, the launcher under its own import name, and no symlinks in the repo to get them there."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_maps_the_top_level_folders_into_the_packages(tmp_path):
    # Built from a copy of the tracked files: setuptools writes build/ next to setup.py.
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for name in tracked.splitlines():
        if (ROOT / name).is_file() and not name.startswith(("tests/", "benchmarks/", "docs/")):
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip_wheel, "-w", str(tmp_path), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("nemo_azr-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {f"nemo_azr/conf/{p.relative_to(ROOT / 'conf')}" for p in (ROOT / "conf").rglob("*.yaml")}
    assert configs and configs <= names
    templates = {
        f"nemo_azr_launch/templates/{p.relative_to(ROOT / 'slurm')}" for p in (ROOT / "slurm").rglob("*.tmpl")
    }
    assert templates and templates <= names and "nemo_azr_launch/cli.py" in names
    assert not any(n.startswith("launcher/") for n in names)  # no top-level package named just "launcher"
    entry_points = (
        zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    )
    assert "nemo-azr-launch = nemo_azr_launch.cli:main" in entry_points


def test_the_repo_has_no_symlinks():
    tracked = subprocess.run(
        ["git", "ls-files", "-s"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t")[1] for line in tracked.splitlines() if line.startswith("120000")]
    assert links == []
