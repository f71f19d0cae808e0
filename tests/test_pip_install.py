"""tox's install command (tools/pip_install.py): a failing ``pip install`` runs again after each pause, never more."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import pip_install


def _install_with_codes(codes: list[int]) -> tuple[int, list[list[str]], list[float]]:
    commands: list[list[str]] = []
    pauses: list[float] = []

    def run(command: list[str]) -> int:
        commands.append(command)
        return codes[len(commands) - 1]

    code = pip_install.install(["-r", "requirements.txt"], run=run, sleep=pauses.append)
    return code, commands, pauses


def test_success_runs_pip_once() -> None:
    code, commands, pauses = _install_with_codes([0])
    assert (code, pauses) == (0, [])
    assert commands == [[sys.executable, "-m", "pip", "install", "-r", "requirements.txt"]]


@pytest.mark.parametrize("failures", [1, 2])
def test_a_network_fault_is_retried_after_a_pause(failures: int, capsys: pytest.CaptureFixture[str]) -> None:
    code, commands, pauses = _install_with_codes([1] * failures + [0])
    assert code == 0
    assert len(commands) == failures + 1
    retry = [sys.executable, "-m", "pip", "install", "--no-cache-dir", "-r", "requirements.txt"]
    assert commands[1:] == [retry] * failures  # a cut-off copy in pip's cache fails every attempt that reads it
    assert pauses == list(pip_install.PAUSES_S[:failures])
    assert capsys.readouterr().err.count("pip_install: pip exited with 1") == failures


def test_a_lasting_failure_returns_pips_code_after_every_attempt() -> None:
    code, commands, pauses = _install_with_codes([2] * (len(pip_install.PAUSES_S) + 1))
    assert code == 2
    assert len(commands) == len(pip_install.PAUSES_S) + 1
    assert pauses == list(pip_install.PAUSES_S)
