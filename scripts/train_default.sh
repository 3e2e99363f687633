#!/usr/bin/env bash
# Set up (if needed) and run the default training job: tiny model, arithmetic, CPU, about 1 minute
# on 2 cores after the installs.
# Extra arguments are Hydra overrides, e.g. `bash scripts/train_default.sh trainer.max_steps=50`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh test
. .venv/bin/activate
exec nemo-azr train "$@"
