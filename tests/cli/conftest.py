"""Helpers for the operator CLI tests: every command runs as a real `forkvisor`
subprocess against a real queue folder in `tmp_path`, and jobs are run by real
managers (`forkvisor run --burst`, or a background `forkvisor run` through the
`procs` fixture of tests/supervisor, whose teardown reaps every process).

The queue is read back through the `jobs` API and its files; the commands'
`--json` outputs are parsed. No sleeping: `wait_until` polls with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobs import Job, Queue, is_job_id
from tests.conftest import FAST_CLI
from tests.processes import (
    APP,
    APP_PATH,
    REPO,
    Processes,
    cmdline,
    forkvisor_command,
    wait_until,
)

FAST_RUN = FAST_CLI
"""`forkvisor run` options small enough for tests (tests/conftest.py)."""

RUN_NO_LEASE = ["--concurrency", "1", "--kill-grace", "0.5", "--poll-interval", "0.2", "--drain-timeout", "5"]
"""For a background manager that takes the lease (and sweep interval) from the queue."""

UNKNOWN_ID = "20200101-000000-000000-0badc0de"


@dataclass(frozen=True)
class Result:
    """A finished `forkvisor` command: exit code, stdout and stderr as text."""

    args: tuple[str, ...]
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.out.strip(), f"`forkvisor {' '.join(self.args)}` printed nothing on stdout; stderr: {self.err}"
        return json.loads(self.out)

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()

    def __str__(self) -> str:
        return f"`forkvisor {' '.join(self.args)}` exited {self.code}\nstdout:\n{self.out}\nstderr:\n{self.err}"


def cli(*args: str | Path, stdin: str | None = None, cwd: Path = REPO, timeout: float = 30.0) -> Result:
    """Run `forkvisor ARGS...` to its end, stdin from `stdin` (else /dev/null), output piped."""
    words = tuple(str(arg) for arg in args)
    done = subprocess.run(
        [*forkvisor_command(), *words],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        check=False,
        env={name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"},  # as in a shell
    )
    return Result(words, done.returncode, done.stdout, done.stderr)


def ok(*args: str | Path, stdin: str | None = None, cwd: Path = REPO, timeout: float = 30.0) -> Result:
    """`cli`, asserting exit 0 and nothing on stderr."""
    result = cli(*args, stdin=stdin, cwd=cwd, timeout=timeout)
    assert result.code == 0, result
    assert result.err == "", result
    return result


def refused(result: Result, code: int, *fragments: str) -> None:
    """The command failed as documented: exit `code`, nothing on stdout, ONE line on stderr
    starting with "forkvisor" (no traceback), containing each fragment."""
    assert result.code == code, result
    assert result.out == "", result
    lines = result.err.splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith("forkvisor"), result
    assert "Traceback" not in result.err, result
    for fragment in fragments:
        assert fragment in lines[0], result


def new_queue(path: Path, **settings: Any) -> Path:
    """A queue folder made through the store (setup, not the command under test)."""
    queue = Queue(path, create=True)
    queue.configure(**{"lease": 3, **settings})
    return path


def submit(queue: Path, *argv: str, options: tuple[str, ...] = ("--max-attempts", "1"), cwd: Path = REPO) -> str:
    """`forkvisor submit QUEUE OPTIONS -- ARGV`; return the id it printed."""
    return one_id(ok("submit", queue, *options, "--", *argv, cwd=cwd))


def enqueue(queue: Path, function: str, *options: str) -> str:
    return one_id(ok("enqueue", queue, function, *options))


def one_id(result: Result) -> str:
    assert len(result.lines) == 1, result
    assert is_job_id(result.lines[0]), result
    return result.lines[0]


def burst(queue: Path, *options: str, app: bool = True, timeout: float = 30.0) -> Result:
    """`forkvisor run QUEUE --burst` with fast settings: run everything there is, then exit 0."""
    result = cli(
        "run", queue, "--burst", *FAST_RUN, *(["--app", APP, *APP_PATH] if app else []), *options, timeout=timeout
    )
    assert result.code == 0, result
    assert "Traceback" not in result.err, result
    return result


def job(queue: Path, job_id: str) -> Job:
    return Queue(queue, create=False).job(job_id)


def counts(queue: Path) -> dict[str, int]:
    return Queue(queue, create=False).counts()


def spec_file(queue: Path, job_id: str) -> dict[str, Any]:
    """The job's job.json as written on disk."""
    data: dict[str, Any] = json.loads((job(queue, job_id).path / "job.json").read_text())
    return data


def attempt_file(queue: Path, job_id: str, name: str, run: int = -1) -> str:
    """A file of one run's folder (default: the last run)."""
    found = job(queue, job_id)
    assert found.history, f"job {job_id} has not run"
    return (found.history[run].path / name).read_text()


def printed(queue: Path, job_id: str, text: str, name: str = "stdout") -> bool:
    """Whether the job's last run wrote `text` to its stdout (or `name`) yet; False before it ran."""
    found = job(queue, job_id)
    if not found.history:
        return False
    try:
        return text in (found.history[-1].path / name).read_text()
    except FileNotFoundError:
        return False  # not created yet, or the job moved as we looked


def wait_explained(condition: Callable[[], object], timeout: float, what: str, explain: Callable[[], str]) -> None:
    """`wait_until`, adding `explain()` (a job's state, a manager's log) to the failure."""
    try:
        wait_until(condition, timeout, what)
    except pytest.fail.Exception as failure:
        pytest.fail(f"{failure}\n{explain()}")


def stop_manager(procs: Processes, manager: subprocess.Popen[bytes]) -> None:
    """SIGTERM a background manager once it has started (its title says so: it handles
    signals from then on) and check it exits 0."""
    wait_until(lambda: "forkvisor: manager" in cmdline(manager.pid), 20, "the manager finished starting")
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 15, "manager after SIGTERM") == 0, procs.log(manager)
