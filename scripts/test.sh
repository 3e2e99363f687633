#!/usr/bin/env bash
# Set up (if needed) and run the test suite (CPU, about 32 minutes on 2 cores with the Slurm tests, measured 2026-12-03). Extra args go to pytest.
# tests/slurm/ starts a one-node Slurm cluster when Slurm is installed and this is root, and is
# skipped otherwise (the reason is printed); NEMO_AZR_SLURM_TESTS=1 also installs Slurm with apt and
# makes them required, NEMO_AZR_SLURM_TESTS=0 skips them (docs/slurm.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
. .venv/bin/activate
exec python -m pytest -q "$@"
