"""The systemd units in examples/systemd (issues 19 and 14): systemd itself finds
nothing wrong with them, and the manager's stop timeout leaves it time to drain."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from jobs import parse_duration
from supervisor import Settings
from tests.processes import REPO, forkvisor_command

UNIT = REPO / "examples" / "systemd" / "forkvisor@.service"
WEB_UNIT = REPO / "examples" / "systemd" / "forkvisor-web.service"


def service_section() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(UNIT)
    return parser["Service"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed (apt: systemd)")
@pytest.mark.parametrize(("unit", "name"), [(UNIT, "forkvisor@reports.service"), (WEB_UNIT, WEB_UNIT.name)])
def test_systemd_finds_nothing_wrong_with_the_unit(tmp_path: Path, unit: Path, name: str) -> None:
    [forkvisor] = forkvisor_command()[:1]  # the ExecStart binary must exist for verify
    instance = tmp_path / name
    instance.write_text(unit.read_text().replace("/opt/forkvisor/bin/forkvisor", forkvisor))
    done = subprocess.run(["systemd-analyze", "verify", str(instance)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # verify exits 0 on unknown keys too: what it says is the finding


def test_the_unit_drains_and_lets_the_drain_finish() -> None:
    service = service_section()
    assert service["Type"] == "notify"
    assert service["KillMode"] == "mixed"  # SIGTERM to the manager only
    drain = Settings().drain_timeout + Settings().kill_grace
    assert parse_duration(service["TimeoutStopSec"]) > drain
    assert service["Restart"] == "on-failure"


@pytest.mark.parametrize("script", sorted((REPO / "examples" / "slurm").glob("*.sbatch")), ids=lambda path: path.name)
def test_a_slurm_script_execs_a_manager_that_drains_before_killwait(script: Path) -> None:
    """The batch shell must not stand between Slurm and the manager (see the README)."""
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
    command = script.read_text().replace("\\\n", " ")
    [line] = [line for line in command.splitlines() if line.lstrip().startswith("exec forkvisor run")]
    words = line.split("#")[0].split()
    drain = parse_duration(words[words.index("--drain-timeout") + 1])
    assert drain < 120, "longer than the KillWait a cluster may have, or than --signal's 120 s warning"
