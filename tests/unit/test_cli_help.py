"""`nemo-azr COMMAND --help` shows what a user can choose: every config group with its options."""

from pathlib import Path

import pytest

from nemo_azr.cli import main

CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.mark.parametrize("command", ["train", "eval", "show-config"])
def test_help_lists_every_config_group_and_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    groups = [d for d in CONF.iterdir() if d.is_dir()]
    assert len(groups) >= 6
    for group in groups:
        options = sorted(f.stem for f in group.glob("*.yaml"))
        assert f"  {group.name}: {', '.join(options)}" in out
    assert "docs/config.md" in out and "show-config" in out


def test_help_of_a_command_without_config_has_no_group_list(capsys):
    with pytest.raises(SystemExit):
        main(["make-tiny-model", "--help"])
    assert "config groups" not in capsys.readouterr().out


def test_eval_summary_line_names_each_kinds_accuracy_or_within_kind_auroc():
    from nemo_azr.cli import _per_kind

    assert _per_kind({"by_kind": {"addition": {"accuracy": 0.5}, "subtraction": {"accuracy": 0.125}}}) == (
        " (addition 0.5, subtraction 0.125)"
    )
    rlcr = {"by_kind": {"pair_lookup": {"auroc": 0.61234, "ece": 0.1}, "word_sub": {"auroc": None}}}
    assert _per_kind(rlcr) == " (AUROC within a kind: pair_lookup 0.612, word_sub n/a)"
    # where confidences failed to parse, the AUROC says over how many of the kind's answers it is
    broken = {"by_kind": {"table_lookup": {"auroc": 0.9643, "n": 17, "num_answers": 155}}}
    assert _per_kind(broken) == " (AUROC within a kind: table_lookup 0.964 over 17 of 155)"
    full = {"by_kind": {"table_lookup": {"auroc": 0.5, "n": 155, "num_answers": 155}}}
    assert _per_kind(full) == " (AUROC within a kind: table_lookup 0.5)"
    # an enumerated evaluation's expected confidence, shown after the written one's
    enumerated = {
        "by_kind": {
            "pair_lookup": {"auroc": 0.5, "expected_auroc": 0.72751},
            "single_lookup": {"auroc": 0.5389, "expected_auroc": 0.9322},
        }
    }
    assert _per_kind(enumerated) == (
        " (AUROC within a kind: pair_lookup 0.5, single_lookup 0.539; expected: pair_lookup 0.728, single_lookup 0.932)"
    )
    assert _per_kind({}) == ""
