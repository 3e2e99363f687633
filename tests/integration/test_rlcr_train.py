"""Both RLCR experiments train real steps on the tiny model; `nemo-azr eval` writes the diagram + JSON."""

import json
import math

import pytest

from nemo_azr.cli import main
from nemo_azr.preflight import load_config
from nemo_azr.trainer.metrics import read_metrics
from nemo_azr.trainer.trainer import Trainer

SMALL = {
    "rlcr_two_turn": [
        "rlcr.num_generations_answer=2",
        "rlcr.num_generations_confidence=2",
        "rlcr.answer_max_new_tokens=16",
        "rlcr.confidence_max_new_tokens=16",
    ],
    "rlcr_single_turn": ["generation.n_samples=3", "generation.max_new_tokens=24"],
}


def _overrides(experiment, tiny_cache, out):
    return [
        f"experiment={experiment}",
        f"model.tiny.cache_dir={tiny_cache}",
        "logger=quiet",
        f"trainer.output_dir={out}",
        "trainer.max_steps=2",
        "sft_warmup.steps=3",
        "sft_warmup.batch_size=4",
        "data.prompts_per_step=2",
        *SMALL[experiment],
    ]


@pytest.mark.parametrize("experiment", ["rlcr_two_turn", "rlcr_single_turn"])
def test_experiment_trains_and_evaluates(experiment, tiny_cache, tmp_path, capsys):
    out = tmp_path / "run"
    result = Trainer(load_config(_overrides(experiment, tiny_cache, out))).fit()
    assert result.status == "completed" and result.step == 2
    records = read_metrics(out / "metrics.jsonl")
    assert len(records) == 2
    for r in records:
        assert math.isfinite(r["actor/loss"]) and r["actor/optimizer_steps"] == 1.0
        assert 0.0 <= r["rlcr/accuracy"] <= 1.0
        assert sum(r[f"rlcr/conf_hist_bin_{k}"] for k in range(5)) in (0.0, pytest.approx(1.0))
        if experiment == "rlcr_two_turn":
            assert r["batch/rows"] == 2 * 2 * (1 + 2)  # prompts x G_a x (1 + G_c)
            for key in ("answer", "confidence"):
                assert f"rlcr/{key}_reward_mean" in r and f"rlcr/{key}_groups_spread_frac" in r
        else:
            assert r["batch/rows"] == 2 * 3

    eval_args = [
        "eval",
        *_overrides(experiment, tiny_cache, out),
        "eval.num_examples=4",
        "eval.answers_per_prompt=2",
    ]
    assert main(eval_args) == 0
    assert "ece=" in capsys.readouterr().out
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["checkpoint"].endswith("step_2")
    assert metrics["num_prompts"] == 4 and metrics["num_answers"] == 8
    assert metrics["num_confidences"] == 8
    assert {"ece", "brier", "auroc", "accuracy", "mean_confidence", "answer_accuracy", "bins"} <= set(metrics)
    assert len(metrics["bins"]) == 10
    assert (out / "eval" / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    # greedy (the default elsewhere): one answer and one confidence per held-out prompt, every reply kept
    assert main([*eval_args, "eval.greedy=true", f"eval.output_dir={out}/greedy"]) == 0
    greedy = json.loads((out / "greedy" / "metrics.json").read_text())
    assert greedy["greedy"] is True and greedy["num_answers"] == greedy["num_confidences"] == 4
    rows = [json.loads(line) for line in (out / "greedy" / "samples.jsonl").read_text().splitlines()]
    confidence_rows = 4 if experiment == "rlcr_two_turn" else 0  # the single turn states both in one reply
    assert sorted(r["sample_type"] for r in rows) == ["answer"] * 4 + ["confidence"] * confidence_rows


def test_analyses_before_enumerated_confidences_train_and_evaluate(tiny_cache, tmp_path, capsys):
    """rlcr.analyses_per_answer through the trainer: each answer's analyses, then every candidate
    after each, in one batch the update takes; the greedy eval states one confidence per answer."""
    out = tmp_path / "run"
    overrides = [
        *_overrides("rlcr_two_turn", tiny_cache, out),
        'rlcr.confidence_prefill="<confidence>"',
        "rlcr.confidence_decoding=enumerate",
        "rlcr.confidence_candidates=[0.1,0.5,0.9]",
        "rlcr.analyses_per_answer=2",
    ]
    result = Trainer(load_config(overrides)).fit()
    assert result.status == "completed" and result.step == 2
    for r in read_metrics(out / "metrics.jsonl"):
        assert r["batch/rows"] == 2 * 2 * (1 + 2 * (1 + 3))  # prompts x G_a x (1 + N x (1 + candidates))
        assert math.isfinite(r["actor/loss"]) and r["actor/grad_norm"] > 0
        assert r["rlcr/analysis_length_mean"] > 0 and 0 <= r["rlcr/analysis_closed_frac"] <= 1
    assert main(["eval", *overrides, "eval.num_examples=4", "eval.greedy=true"]) == 0
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert metrics["num_answers"] == metrics["num_confidences"] == 4
    assert "expected_confidence" in metrics


@pytest.mark.parametrize("greedy_answer_kl", [True, False])
def test_contrasted_candidates_with_the_kl_term_on_the_argmax_answers_train(
    tiny_cache, tmp_path, greedy_answer_kl
):
    """The batch contrast mixed with the answer baseline, the mass and level terms, and a KL term kept off the
    confidence rows (rlcr.confidence_kl=false) through the trainer (the tiny experiment's warm-up
    moves the policy from the KL reference first). With rlcr.greedy_answer_kl the update takes the
    zero-advantage argmax answers and their KL term is not 0; without it no row carries a KL term."""
    out = tmp_path / "run"
    overrides = [
        *_overrides("rlcr_two_turn", tiny_cache, out),
        "rlcr.answer_decoding=greedy",
        "rlcr.num_generations_answer=1",
        'rlcr.confidence_prefill="<confidence>"',
        "rlcr.confidence_decoding=enumerate",
        "rlcr.confidence_candidates=[0.1,0.5,0.9]",
        "rlcr.candidate_weighting=uniform",
        "rlcr.candidate_baseline=batch",
        "rlcr.candidate_batch_share=0.5",
        "rlcr.candidate_mass_coef=0.5",
        "rlcr.candidate_level_coef=1.0",
        f"rlcr.greedy_answer_kl={str(greedy_answer_kl).lower()}",
        "rlcr.confidence_kl=false",
        "algorithm.kl.coef=0.5",
    ]
    result = Trainer(load_config(overrides)).fit()
    assert result.status == "completed" and result.step == 2
    records = read_metrics(out / "metrics.jsonl")
    assert all(math.isfinite(r["actor/loss"]) and r["actor/grad_norm"] > 0 for r in records)
    if greedy_answer_kl:
        assert all(r["actor/kl_loss"] > 0 for r in records)
    else:
        assert all(r["actor/kl_loss"] == 0 for r in records)


def test_eval_without_checkpoint_is_a_clear_error(tiny_cache, tmp_path, capsys):
    args = [
        "eval",
        "experiment=rlcr_two_turn",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("nemo-azr: error: eval.checkpoint=auto: no complete checkpoint") and "\n" not in err


def test_eval_scores_accuracy_of_a_single_turn_run_on_the_held_out_split(tiny_cache, tmp_path, capsys):
    args = [
        "eval",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
        "eval.checkpoint=model",
        "data.eval_size=6",
    ]
    assert main(args) == 0
    assert "accuracy=" in capsys.readouterr().out
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_prompts"] == metrics["num_responses"] == 6 and metrics["greedy"] is True
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6
    # accuracy is the mean of the task's own reward of each written response
    from nemo_azr.rewards.accuracy import accuracy_reward

    assert metrics["accuracy"] == pytest.approx(
        sum(accuracy_reward(s["gold"], s["response"], s["question"]) for s in samples) / 6
    )
    # per operation: the kinds partition the prompts and their accuracies average back
    by_kind = metrics["by_kind"]
    assert set(by_kind) <= {"addition", "subtraction", "multiplication"}
    assert sum(k["n"] for k in by_kind.values()) == 6
    assert sum(k["n"] * k["accuracy"] for k in by_kind.values()) / 6 == pytest.approx(metrics["accuracy"])
    # the same problems in held-out phrasings (committed templates, never the training one)
    from nemo_azr.tasks.arithmetic import rephrasing_templates

    rephrased = [
        json.loads(line) for line in (tmp_path / "eval" / "samples_rephrased.jsonl").read_text().splitlines()
    ]
    assert metrics["rephrased"]["num_responses"] == len(rephrased) == 6
    assert sorted(r["gold"] for r in rephrased) == sorted(s["gold"] for s in samples)
    all_templates = [t for ts in rephrasing_templates().values() for t in ts]
    training_question = {s["prompt_id"]: s["question"] for s in samples}
    for r in rephrased:
        assert r["question"] != training_question[r["prompt_id"].rsplit("-r", 1)[0]]
        assert any(r["question"] == t.format(a=a, b=b) for t in all_templates for a, b in _operands(r))
    assert metrics["rephrased"]["accuracy"] == pytest.approx(
        sum(accuracy_reward(r["gold"], r["response"], r["question"]) for r in rephrased) / 6
    )


def _operands(record):
    """(a, b) of an arithmetic prompt id ``arith-{a}{op}{b}-r{k}``."""
    import re

    a, b = re.match(r"arith-(\d+)[-+*](\d+)", record["prompt_id"]).groups()
    return [(int(a), int(b))]


def test_eval_of_self_play_without_a_held_out_set_is_a_clear_error(tiny_cache, tmp_path, capsys):
    args = [
        "eval",
        "experiment=azr_code",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
        "eval.checkpoint=model",
    ]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "has no held-out set" in err and "plot-selfplay" in err


def _sandbox_eval_error(tiny_cache, tmp_path, capsys, *overrides) -> str:
    """stderr of an `azr_sandbox` eval of the untrained model that must stop with a config error."""
    args = [
        "eval",
        "experiment=azr_sandbox",
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
        "eval.checkpoint=model",
        *overrides,
    ]
    assert main(args) == 2
    return capsys.readouterr().err


def test_self_play_eval_with_both_parts_off_is_a_clear_error(tiny_cache, tmp_path, capsys):
    overrides = ("eval.selfplay_solver=false", "eval.selfplay_proposals_per_seed=0")
    assert "evaluates nothing" in _sandbox_eval_error(tiny_cache, tmp_path, capsys, *overrides)


def test_a_missing_fixed_solver_names_its_setting(tiny_cache, tmp_path, capsys):
    err = _sandbox_eval_error(tiny_cache, tmp_path, capsys, f"eval.selfplay_fixed_solver={tmp_path / 'nope'}")
    assert "eval.selfplay_fixed_solver=" in err and "neither a step_N checkpoint nor a model folder" in err
