"""The systemd unit in examples/systemd (issue 19): systemd itself finds nothing
wrong with it, and its stop timeout leaves the manager time to drain."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import parse_duration
from supervisor.settings import default
from tests.processes import REPO, forkvisor_command

UNIT = REPO / "examples" / "systemd" / "forkvisor@.service"


def service_section() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(UNIT)
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (apt: systemd)")
def test_systemd_finds_nothing_wrong_with_the_unit(tmp_path: Path) -> None:
    [forkvisor] = forkvisor_command()[:1]  # the ExecStart binary must exist for verify
    instance = tmp_path / "forkvisor@reports.service"
    instance.write_text(UNIT.read_text().replace("/opt/forkvisor/bin/forkvisor", forkvisor))
    done = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # verify exits 0 on unknown keys too: what it says is the finding


def test_the_unit_drains_and_lets_the_drain_finish() -> None:
    service = service_section()
    assert service["Type"] == "notify"
    assert service["KillMode"] == "mixed"  # SIGTERM to the manager only
    drain = float(default("drain_timeout")) + float(default("kill_grace"))  # type: ignore[arg-type]
    assert parse_duration(service["TimeoutStopSec"]) > drain
    assert service["Restart"] == "on-failure"
