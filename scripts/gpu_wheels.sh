#!/usr/bin/env bash
# Download, on a machine with PyPI access, the wheels scripts/gpu_check.sh installs on a GPU machine
# that has torch/transformers but no network (the workplace's device image: Python 3.12, x86_64).
# They land in .gpu_wheels/ (git-ignored, ~3.5 MB), which the device tool carries.
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION="${PY_VERSION:-3.12}"
dest=.gpu_wheels
mkdir -p "$dest"
pip download --quiet --disable-pip-version-check --dest "$dest" --no-deps --only-binary=:all: \
  --python-version "$PY_VERSION" --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
  megatron-core==0.16.1 hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended \
  text2num==3.1.0 liger-kernel==0.8.5
# omegaconf needs antlr4 4.9.*, published as a (pure-Python) source package only: built into a wheel
# here, since gpu_check.sh installs wheels only (the GPU machine has no network to build from source).
pip download --quiet --disable-pip-version-check --dest "$dest" --no-deps antlr4-python3-runtime==4.9.3
pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$dest" "$dest"/antlr4-python3-runtime-4.9.3.tar.gz
ls -1 "$dest"
