#!/usr/bin/env bash
# Kill -9 / resume soak of the default tiny job: N cycles of "train, kill -9 at a random point
# (start-up, a step, a save), maybe damage the newest checkpoint, resume", then the final metrics
# and weights must equal an uninterrupted run's bit for bit. Only its own training processes are
# killed (each runs in its own process group).
#
#   bash scripts/soak.sh                        # 50 cycles into outputs/soak (~8 min on 2 cores)
#   bash scripts/soak.sh --cycles 5 --out /tmp/soak
#   bash scripts/soak.sh --async                 # async rollout (lag 1 + TIS): in-flight batches resume exactly
#   bash scripts/soak.sh --second-writer-prob 0.5  # half the launches face a second run on their folder
#   bash scripts/soak.sh --cycles 50 --results benchmarks/results/soak   # the committed result
#
# Options: python benchmarks/soak.py --help. Exit status 0 only if every episode was equal and
# every damaged checkpoint was handled.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || bash scripts/setup_env.sh
exec "$PYTHON" benchmarks/soak.py "$@"
