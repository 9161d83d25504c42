"""Every forkvisor process has a short kernel name without spaces that says its role
(issue 19): `ps -e`, `pgrep` and Slurm's process tracking read `/proc/PID/stat`, and
Slurm skips a process whose name holds a space (so a `scancel` never reached it).
The long titles stay for `ps -f`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from jobs import Queue
from tests import sample_jobs
from tests.processes import APP, APP_PATH, FAST_CLI, REPO, Processes, read_pid, wait_until


def stat_name(pid: int) -> str:
    """The name field of /proc/PID/stat, read as a `%d %s` scanner would: up to the first space."""
    fields = Path(f"/proc/{pid}/stat").read_text().split(" ")
    return fields[1]


@pytest.mark.slow
def test_manager_sweeper_and_job_have_short_names_without_spaces(
    procs: Processes, queue: Queue, barriers: Path
) -> None:
    ready = barriers / "ready"
    queue.enqueue(sample_jobs.block, str(ready))
    manager = procs.forkvisor("run", str(queue.path), "--app", APP, *APP_PATH, *FAST_CLI)
    wait_until(ready.exists, 10, "the job started")
    job = read_pid(ready)

    def sweeper() -> int | None:
        children = [c for c in psutil.Process(manager.pid).children() if c.pid != job]
        return children[0].pid if children else None

    wait_until(lambda: sweeper() is not None, 10, "the manager started its sweeper")
    names = {stat_name(pid): pid for pid in (manager.pid, sweeper() or 0, job)}
    assert set(names) == {"(fv-manager)", "(fv-sweeper)", "(fv-job)"}, names
    assert psutil.Process(manager.pid).name() == "fv-manager"
    assert " ".join(psutil.Process(manager.pid).cmdline()).startswith(f"forkvisor: manager {queue.path}")
    assert " ".join(psutil.Process(job).cmdline()).startswith("forkvisor: job ")
    manager.send_signal(signal.SIGTERM)  # a second one stops the blocking job at once
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 15, "the manager after SIGTERM") == 0, procs.log(manager)


def test_a_manager_configured_through_its_environment_still_shows_its_title(queue: Queue, tmp_path: Path) -> None:
    """The manager removes its FORKVISOR_* variables once read (no job inherits them); done
    before setproctitle had found its memory, that silently lost every title (`pgrep`,
    Slurm and the tests that wait for a manager to start saw nothing) whenever one stood
    before the last variable of the environment. Started as
    `python -m supervisor.cli`, as the chaos run starts its managers."""
    command = [sys.executable, "-m", "supervisor.cli", "run", str(queue.path), "--app", APP, *APP_PATH, *FAST_CLI]
    with (tmp_path / "manager.log").open("wb") as log:
        manager = subprocess.Popen(
            command, cwd=REPO, env={"FORKVISOR_CONCURRENCY": "2", **os.environ}, stdout=log, stderr=subprocess.STDOUT
        )
    try:

        def title() -> str:
            return " ".join(psutil.Process(manager.pid).cmdline())

        wait_until(lambda: title().startswith(f"forkvisor: manager {queue.path} 0/2 busy"), 10, "the manager's title")
    finally:
        manager.send_signal(signal.SIGTERM)
        assert manager.wait(15) == 0, (tmp_path / "manager.log").read_text()
