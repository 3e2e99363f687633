#!/usr/bin/env bash
# Set up (if needed) and run the test suite (CPU, ~10 minutes on 2 cores). Extra args go to pytest.
# As root, tests/slurm/ starts a one-node Slurm cluster (installing it with apt if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
. .venv/bin/activate
exec python -m pytest -q "$@"
