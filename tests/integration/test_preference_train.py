"""``preference.loss=dpo|ipo|kto``: the trainer's steps train on preference pairs (seed 004, class 5).

The first step's loss is the papers' value for a policy equal to its reference (DPO: log 2, IPO:
(1 / (2 beta))^2, KTO: lambda / 2, every implicit reward 0); steps over the same pairs lower the loss; a resumed run
continues the uninterrupted one metric for metric (loader position, AdamW state, reference).
"""

from __future__ import annotations

import json
import math

import pytest

from nemo_azr.preflight import load_config
from nemo_azr.tasks.preference_data import PreferencePair, write_pairs_jsonl
from nemo_azr.trainer.metrics import read_metrics, without_machine_metrics
from nemo_azr.trainer.trainer import Trainer

PAIRS = [
    PreferencePair(f"p{i}", f"What is {i} + {i}?", str(2 * i), f"{2 * i} or {2 * i + 1}") for i in range(1, 9)
]


def _overrides(tiny_cache, out, pairs_file, *extra):
    return [
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        "sft_warmup.steps=0",  # the reference is then the model the steps start from
        f"preference.pairs_path={pairs_file}",
        "data.prompts_per_step=8",  # every pair, every step
        "optim.lr=0.003",
        *extra,
    ]


@pytest.fixture
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    write_pairs_jsonl(PAIRS, path)
    return path


@pytest.mark.parametrize(("loss", "first"), [("dpo", math.log(2)), ("ipo", (1 / (2 * 0.1)) ** 2)])
def test_preference_steps_start_at_the_papers_value_and_lower_the_loss(
    tiny_cache, tmp_path, pairs_file, loss, first
):
    out = tmp_path / loss
    cfg = load_config(
        _overrides(tiny_cache, out, pairs_file, f"preference.loss={loss}", "trainer.max_steps=6")
    )
    result = Trainer(cfg).fit()
    assert result.status == "completed" and result.step == 6
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[0]["preference/loss"] == pytest.approx(first, rel=1e-5)
    assert rows[0]["preference/reward_margin"] == pytest.approx(0.0, abs=1e-6)
    assert all(r["preference/pairs"] == 8 and r["batch/rows"] == 16 for r in rows)
    assert rows[-1]["preference/loss"] < 0.9 * rows[0]["preference/loss"]
    assert rows[-1]["preference/reward_accuracy"] > 0.5
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert {s["response"] for s in samples} <= {p.chosen for p in PAIRS} | {p.rejected for p in PAIRS}


def test_kto_steps_train_on_the_pairs_rows_unpaired(tiny_cache, tmp_path, pairs_file):
    out = tmp_path / "kto"
    cfg = load_config(
        _overrides(
            tiny_cache, out, pairs_file, "preference.loss=kto", "preference.beta=0.5", "trainer.max_steps=6"
        )
    )
    assert Trainer(cfg).fit().status == "completed"
    rows = read_metrics(out / "metrics.jsonl")
    assert rows[0]["preference/loss"] == pytest.approx(0.5, rel=1e-5)  # lambda (1 - sigmoid(0)), lambda = 1
    assert rows[0]["preference/kl_reference"] == pytest.approx(0.0, abs=1e-6)
    # 8 chosen + 8 rejected rows, and one mismatched row each for the reference point
    assert all(r["preference/examples"] == 16 and r["batch/rows"] == 32 for r in rows)
    assert rows[-1]["preference/loss"] < rows[0]["preference/loss"]
    assert rows[-1]["preference/reward_margin"] > 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    replies = {(p.prompt, p.chosen) for p in PAIRS} | {(p.prompt, p.rejected) for p in PAIRS}
    assert samples and {(s["prompt"], s["response"]) for s in samples} <= replies


def test_kto_trains_on_a_file_of_unpaired_examples(tiny_cache, tmp_path):
    from nemo_azr.tasks.preference_data import LabelledReply, write_unpaired_jsonl

    rows = [
        LabelledReply(f"u{i}", p.prompt, p.chosen if i % 3 else p.rejected, bool(i % 3))
        for i, p in enumerate(PAIRS)
    ]
    write_unpaired_jsonl(rows, tmp_path / "u.jsonl")
    out = tmp_path / "kto_unpaired"
    cfg = load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={out}",
            "sft_warmup.steps=0",
            f"preference.unpaired_path={tmp_path / 'u.jsonl'}",
            "preference.loss=kto",
            "preference.beta=0.5",
            "data.prompts_per_step=8",
            "optim.lr=0.003",
            "trainer.max_steps=4",
        ]
    )
    assert Trainer(cfg).fit().status == "completed"
    metrics = read_metrics(out / "metrics.jsonl")
    assert metrics[0]["preference/loss"] == pytest.approx(0.5, rel=1e-5)
    assert all(r["preference/examples"] == 8 and r["batch/rows"] == 16 for r in metrics)
    assert metrics[-1]["preference/loss"] < metrics[0]["preference/loss"]


def test_a_resumed_preference_run_continues_the_uninterrupted_one(tiny_cache, tmp_path, pairs_file):
    steps = ("preference.loss=dpo", "data.prompts_per_step=4", "trainer.max_steps=4")
    full, part = tmp_path / "full", tmp_path / "part"
    Trainer(load_config(_overrides(tiny_cache, full, pairs_file, *steps))).fit()
    # the same run in two slices of 2 steps: it checkpoints, stops, and the second start resumes
    sliced = load_config(_overrides(tiny_cache, part, pairs_file, *steps, "trainer.max_steps_per_run=2"))
    assert Trainer(sliced).fit().status == "paused"
    assert Trainer(sliced).fit().status == "completed"
    want = without_machine_metrics(read_metrics(full / "metrics.jsonl"))
    got = without_machine_metrics(read_metrics(part / "metrics.jsonl"))
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert got == want


@pytest.mark.parametrize("style", ["bare", "equation"])
def test_generated_arithmetic_pairs_reach_the_steps_in_their_style(tiny_cache, tmp_path, style):
    out = tmp_path / style
    cfg = load_config(
        [
            f"model.tiny.cache_dir={tiny_cache}",
            "logger=quiet",
            f"trainer.output_dir={out}",
            "sft_warmup.steps=0",
            "data.task=arithmetic",
            "preference.loss=dpo",
            f"preference.pair_style={style}",
            "trainer.max_steps=1",
        ]
    )
    Trainer(cfg).fit()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all((" = " in s["response"]) == (style == "equation") for s in samples)
