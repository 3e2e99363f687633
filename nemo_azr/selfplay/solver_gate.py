"""Two time scales for the roles: the solver trains only while the proposer keeps the band reachable.

With one shared model the solver (many rows, a clear reward) outgrows the proposer's questions: it
grows safe on every temptation the proposer can write, the learnability band empties and the proposer
loses its signal (docs/selfplay.md, runs 3-9). Against a solver that does not train, the proposer
learns to aim at the band (run 10). The gate ties the two: a moving average of the first-pass
learnable ratio (the share of first proposals' questions that land in the band) decides each step
whether the solver's rows join the update. While the proposer's questions teach, both roles train;
when the solver has outgrown them, only the proposer trains until it catches up. It is the
two-time-scale idea of GAN training (a faster and a slower player) with the pace set by feedback
instead of a fixed ratio.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class SolverGate:
    """``threshold`` 0 = off (the seeds' joint update: the solver trains every step).

    ``decay`` weighs the past in the exponential moving average (0 = this step's ratio alone)."""

    threshold: float = 0.0
    decay: float = 0.7
    average: float | None = None  # None until the first step

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def observe(self, first_pass_ratio: float) -> bool:
        """Fold this step's first-pass learnable ratio into the average; True when the solver's rows
        train this step (always, when the gate is off)."""
        ratio = float(first_pass_ratio)
        self.average = ratio if self.average is None else self.decay * self.average + (1 - self.decay) * ratio
        return not self.enabled or self.average >= self.threshold

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        average = state.get("average")
        self.average = None if average is None else float(average)
