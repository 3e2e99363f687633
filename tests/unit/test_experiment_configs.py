"""Every committed experiment composes and passes the config checks a run makes before it starts."""

from pathlib import Path

import pytest

from nemo_azr.errors import ConfigError
from nemo_azr.preflight import load_config

EXPERIMENTS = sorted(
    p.stem for p in (Path(__file__).resolve().parents[2] / "conf" / "experiment").glob("*.yaml")
)
# experiments that start from an artefact an earlier documented command writes: their check must
# fail on that missing artefact alone, naming the command
NEEDS_ARTEFACT = {
    "arithmetic_dpo_smollm2": "nemo-azr sample-pairs",
    "arithmetic_rm_smollm2": "nemo-azr train-rm",
}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_config_is_valid(experiment: str, tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative artefact paths resolve where none exist
    if experiment in NEEDS_ARTEFACT:
        with pytest.raises(ConfigError, match=NEEDS_ARTEFACT[experiment]):
            load_config([f"experiment={experiment}"])
        return
    cfg = load_config([f"experiment={experiment}"])
    assert cfg.experiment_name == experiment  # an inheriting experiment names its own outputs


def test_the_lookups_experiment_keeps_the_two_turn_prompts_and_changes_only_its_objective():
    base = load_config(["experiment=rlcr_two_turn_smollm2"])
    lookups = load_config(["experiment=rlcr_two_turn_lookups_smollm2"])
    # the prompts, demonstrations and decoding of the measured two-turn experiment, unchanged
    assert lookups.rlcr.confidence_prompt == base.rlcr.confidence_prompt
    assert lookups.data.demonstrations == base.data.demonstrations
    assert lookups.rlcr.answer_decoding == base.rlcr.answer_decoding == "greedy"
    # the question mix and the confidence objective are its own
    assert list(lookups.data.synthetic_qa.kinds) == ["single_lookup", "pair_lookup", "table_lookup"]
    assert (lookups.rlcr.confidence_decoding, lookups.rlcr.candidate_baseline) == ("enumerate", "kind")
    assert lookups.trainer.output_dir == "outputs/rlcr_two_turn_lookups_smollm2"
