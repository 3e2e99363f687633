"""benchmarks/rlcr_probe.py: the asked-row rule and the cross-validated probe's AUROC."""

import math
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import rlcr_probe  # noqa: E402


def test_asked_last_row_reads_the_list_and_the_asked_name():
    assert rlcr_probe.asked_last_row("Ages: Dina 17, Fay 96. What is the age of Fay?") == 1
    assert rlcr_probe.asked_last_row("Ages: Dina 17, Fay 96. What is the age of Dina?") == 0
    four = "Scores: Sharks 93, Wolves 20, Eagles 10, Tigers 86. What is the score of Tigers?"
    assert rlcr_probe.asked_last_row(four) == 1
    assert rlcr_probe.asked_last_row(four.replace("of Tigers", "of Wolves")) == 0
    assert rlcr_probe.asked_last_row("Kim has 15 pens and gets 23 more. How many?") == 0


def test_probe_auroc_finds_a_direction_that_holds_the_label_and_not_one_that_does_not():
    rng = np.random.default_rng(0)
    labels = np.array([0, 1] * 60)
    noise = rng.normal(size=(120, 16))
    informative = noise.copy()
    informative[:, 3] += 3.0 * labels  # one dimension carries the label
    assert rlcr_probe.probe_auroc(informative, labels) > 0.95
    assert rlcr_probe.probe_auroc(noise, labels) < 0.7  # out of fold: no fitting the noise
    assert math.isnan(rlcr_probe.probe_auroc(noise, np.zeros(120, dtype=int)))  # one class: no AUROC
