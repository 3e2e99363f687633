#!/usr/bin/env bash
# Reproduces the two-turn vs single-turn comparison of docs/rlcr.md (CPU, tiny model).
# Usage: scripts/rlcr_compare.sh [STEPS] [OUT_ROOT]   (defaults: 20 outputs/rlcr_compare)
set -euo pipefail
STEPS="${1:-20}"
ROOT="${2:-outputs/rlcr_compare}"
for EXP in rlcr_two_turn rlcr_single_turn; do
  OUT="$ROOT/$EXP"
  # warm-up only (step 0): the starting point of the RL runs
  nemo-azr train experiment=$EXP logger=quiet trainer.max_steps=0 trainer.output_dir="$OUT-step0"
  nemo-azr eval experiment=$EXP trainer.output_dir="$OUT-step0"
  # warm-up + STEPS RL steps (the experiment as shipped: std-normalised advantages)
  /usr/bin/time -f "$EXP: %e s wall" nemo-azr train experiment=$EXP logger=quiet \
    trainer.max_steps="$STEPS" trainer.output_dir="$OUT"
  nemo-azr eval experiment=$EXP trainer.output_dir="$OUT"
done
# Variants without std scaling, resumed from the same warm-up checkpoints.
nemo-azr train experiment=rlcr_two_turn logger=quiet trainer.max_steps="$STEPS" rlcr.scale_std=false \
  trainer.resume="$ROOT/rlcr_two_turn-step0/checkpoints/step_0" trainer.output_dir="$ROOT/rlcr_two_turn_nostd"
nemo-azr eval experiment=rlcr_two_turn trainer.output_dir="$ROOT/rlcr_two_turn_nostd"
nemo-azr train experiment=rlcr_single_turn logger=quiet trainer.max_steps="$STEPS" algorithm.norm_by_std=false \
  trainer.resume="$ROOT/rlcr_single_turn-step0/checkpoints/step_0" trainer.output_dir="$ROOT/rlcr_single_turn_nostd"
nemo-azr eval experiment=rlcr_single_turn trainer.output_dir="$ROOT/rlcr_single_turn_nostd"
