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

    ``decay`` weighs the past in the exponential moving average (0 = this step's ratio alone).
    ``max_consecutive`` > 0 caps the solver's run of trained steps: after that many in a row the next
    step trains the proposer alone, whatever the average says. The average lags the band, so without
    a cap the solver can train several steps past the point where its questions stop teaching it
    (docs/selfplay.md, run 11: six solver steps in eight emptied the band)."""

    threshold: float = 0.0
    decay: float = 0.7
    max_consecutive: int = 0  # 0 = no cap
    average: float | None = None  # None until the first step
    consecutive: int = 0  # solver-trained steps in a row up to the last one

    @property
    def enabled(self) -> bool:
        return self.threshold > 0

    def observe(self, first_pass_ratio: float) -> bool:
        """Fold this step's first-pass learnable ratio into the average; True when the solver's rows
        train this step (always, when the gate is off)."""
        ratio = float(first_pass_ratio)
        self.average = ratio if self.average is None else self.decay * self.average + (1 - self.decay) * ratio
        if not self.enabled:
            return True
        capped = 0 < self.max_consecutive <= self.consecutive
        train = self.average >= self.threshold and not capped
        self.consecutive = self.consecutive + 1 if train else 0
        return train

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        average = state.get("average")
        self.average = None if average is None else float(average)
        self.consecutive = int(state.get("consecutive", 0))  # checkpoints before the cap lack it
