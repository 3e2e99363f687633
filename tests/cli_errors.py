"""The one-line CLI error check shared by the bad-input tests."""

from __future__ import annotations

from nemo_azr.cli import main


def cli_error(capsys, *overrides: str, command: str = "show-config") -> str:
    """Run ``nemo-azr COMMAND OVERRIDES...``: it must exit 2 with one ``nemo-azr: error:`` line."""
    code = main([command, *overrides])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err  # one line, no traceback
    assert lines[0].startswith("nemo-azr: error: ")
    return lines[0]
