"""``nemo-azr sample-pairs``: pairs from the policy's own replies ranked by the task's rule."""

from __future__ import annotations

import json

import pytest

from nemo_azr.cli import main
from nemo_azr.errors import ConfigError
from nemo_azr.evaluation.pair_sampling import pairs_from_records, sample_pairs
from nemo_azr.preflight import load_config
from nemo_azr.tasks import build_task
from nemo_azr.tasks.preference_data import load_pairs_jsonl


def _rec(prompt_id: str, response: str, reward: float) -> dict:
    return {
        "prompt_id": prompt_id,
        "question": f"question {prompt_id}",
        "response": response,
        "reward": reward,
    }


def test_pairs_take_a_best_reply_against_a_worst_one_per_prompt():
    records = [
        _rec("a", "right", 1.0),
        _rec("b", "also right", 1.0),
        _rec("a", "wrong 1", 0.0),
        _rec("c", "no", 0.0),
        _rec("d", "half", 0.5),
        _rec("a", "wrong 2", 0.0),
        _rec("b", "right again", 1.0),
        _rec("d", "low", 0.2),
        _rec("c", "no again", 0.0),
        _rec("d", "high", 0.9),
        _rec("d", "  ", 0.0),  # empty: not a reply a pair can hold
    ]
    pairs, counts = pairs_from_records(records, seed=3)
    assert counts == {"prompts": 4, "pairs": 2, "all_same": 2, "all_right": 1, "all_wrong": 1, "empty": 1}
    by_id = {p.id: p for p in pairs}
    assert set(by_id) == {"a", "d"}
    assert by_id["a"].chosen == "right" and by_id["a"].rejected in ("wrong 1", "wrong 2")
    assert by_id["a"].prompt == "question a"
    assert (by_id["d"].chosen, by_id["d"].rejected) == ("high", "low")  # 0.5 is neither end
    assert pairs_from_records([], seed=0) == (
        [],
        {"prompts": 0, "pairs": 0, "all_same": 0, "all_right": 0, "all_wrong": 0, "empty": 0},
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("generation.n_samples=1 algorithm.estimator=reinforce_plus_plus", "at least 2 replies"),
        ("experiment=rlcr_two_turn", "single-turn"),
        ("preference.sample_prompts=0", "sample_prompts must be >= 1"),
        # the error names the setting the path came from, not eval.checkpoint
        (
            "preference.sample_checkpoint=/no/such/model",
            "preference.sample_checkpoint='/no/such/model' is neither",
        ),
    ],
)
def test_bad_sampling_settings_are_one_line_errors(tiny_cache, tmp_path, override, message):
    cfg = load_config(
        [f"model.tiny.cache_dir={tiny_cache}", f"trainer.output_dir={tmp_path}", *override.split()]
    )
    with pytest.raises(ConfigError, match=message):
        sample_pairs(cfg)


def test_sample_pairs_writes_the_scored_replies_and_their_pairs(tiny_cache, tmp_path):
    overrides = [
        f"model.tiny.cache_dir={tiny_cache}",
        f"trainer.output_dir={tmp_path}",
        "preference.sample_prompts=6",
        "generation.n_samples=3",
        "generation.max_new_tokens=8",
        "eval.prompts_per_batch=4",  # two batches
    ]
    # neither a reward model the run names nor a DPO run's pairs are read (these pairs may be either's)
    dpo = ["preference.loss=dpo", f"preference.pairs_path={tmp_path / 'sampled_pairs.jsonl'}"]
    assert main(["sample-pairs", *overrides, f"reward_model.path={tmp_path / 'reward_model'}", *dpo]) == 0
    records = [
        json.loads(line) for line in (tmp_path / "sampled_pairs.replies.jsonl").read_text().splitlines()
    ]
    assert len(records) == 6 * 3
    assert len({r["prompt_id"] for r in records}) == 6
    # every reply is a training problem's, scored by the task's own rule
    task = build_task(load_config(overrides).data, split="train")
    examples = {ex.prompt_id: ex for ex in task.examples}
    for r in records:
        assert r["reward"] == task.reward(examples[r["prompt_id"]], r["response"])
        assert r["question"] == examples[r["prompt_id"]].question
    want, counts = pairs_from_records(records, seed=0)
    written = [json.loads(line) for line in (tmp_path / "sampled_pairs.jsonl").read_text().splitlines()]
    assert written == [
        {"id": p.id, "prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in want
    ]
    if want:  # the file is what train-rm and DPO read
        assert load_pairs_jsonl(tmp_path / "sampled_pairs.jsonl") == want
    summary = json.loads((tmp_path / "sampled_pairs.summary.json").read_text())
    assert {k: summary[k] for k in counts} == counts and summary["replies"] == 18


def test_eval_of_a_dpo_experiment_does_not_need_its_pairs(tiny_cache, tmp_path, capsys):
    missing = tmp_path / "not_sampled_yet.jsonl"
    overrides = [f"model.tiny.cache_dir={tiny_cache}", f"trainer.output_dir={tmp_path}", "data.eval_size=2"]
    assert (
        main(
            [
                "eval",
                *overrides,
                "eval.checkpoint=model",
                "preference.loss=dpo",
                f"preference.pairs_path={missing}",
            ]
        )
        == 0
    )
    assert "eval of" in capsys.readouterr().out
    # training does read them: one line naming the file and the command that writes it
    assert main(["train", *overrides, "preference.loss=dpo", f"preference.pairs_path={missing}"]) != 0
    assert "not_sampled_yet.jsonl': no such file (`nemo-azr sample-pairs`" in capsys.readouterr().err
