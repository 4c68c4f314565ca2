"""The ``treadle`` command parses and documents itself."""

from __future__ import annotations

import pytest

from treadle import cli


def test_help_lists_cluster_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert "cluster" in capsys.readouterr().out


def test_no_command_prints_help_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "usage: treadle" in capsys.readouterr().out


def test_cluster_requires_an_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["cluster"])
    assert exc.value.code == 2
    assert "ACTION" in capsys.readouterr().err
