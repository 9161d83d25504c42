"""The process tests' helpers and fixtures (shared through tests/conftest.py): a queue
in `tmp_path`, managers run in this process (driven step by step) or as real
`forkvisor run` subprocesses, and a teardown that reaps every process a test started.

Rules (STYLE.md section 9): no bare sleep. `wait_until` polls a condition with
a small backoff (or drives a manager with `step`) and fails naming what never
happened. Managers run in this process and `forkvisor` subprocesses never
share a test: a manager reaps any child of its process (`wait4(-1)`), so it
would steal a subprocess's exit status.

While a test runs, this process is a child subreaper (as a manager makes its
own process), so processes orphaned by a killed manager come back here and
are reaped and checked in teardown rather than escaping to init.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import psutil
import pytest
from setproctitle import getproctitle, setproctitle

from jobs import Job, Queue, State
from supervisor import Manager, forking
from tests import sample_jobs
from tests.conftest import FAST, FAST_CLI, REPO, wait_until

__all__ = ["FAST", "FAST_CLI", "REPO", "wait_until"]  # also here: the process tests take them with the rest

APP = "tests.sample_jobs:registry"
APP_PATH = ["--path", str(REPO)]  # --app modules are found where --path says, never in the current folder


def read_pid(path: Path) -> int:
    return int(path.read_text().split()[0])


def pids_in(path: Path) -> list[int]:
    return [int(word) for word in path.read_text().split()]


def is_gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie counts: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def cmdline(pid: int) -> str:
    """The process title as `ps` shows it (NULs as spaces); empty once the process is gone."""
    try:
        found = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return ""  # it exited and was reaped as we looked
    return found.replace(b"\0", b" ").decode(errors="replace").strip()


def outcome(found: Job, number: int = -1) -> dict[str, Any]:
    """The outcome.json of one attempt (default: the last)."""
    assert found.history, f"job {found.id} has no attempt folder"
    result = found.history[number].outcome
    assert result is not None, f"attempt {found.history[number].number} of job {found.id} has no outcome.json"
    return dict(result)


def error_json(found: Job) -> dict[str, Any]:
    assert found.state is State.DEAD, f"job {found.id} is {found.state.value}, not dead"
    assert found.error is not None, f"dead job {found.id} has no error.json"
    return dict(found.error)


def settle(manager: Manager, queue: Queue, job_ids: list[str], timeout: float = 10.0) -> None:
    """Step `manager` until every job is done or dead and nothing runs."""

    def settled() -> bool:
        return not manager.running and all(queue.job(i).state.terminal for i in job_ids)

    wait_until(settled, timeout, f"jobs {job_ids} were all done or dead", manager=manager)


def launch(manager: Manager, count: int = 1, timeout: float = 5.0) -> list[int]:
    """Step a started `manager` until `count` children run; return their pids."""
    wait_until(lambda: len(manager.running) >= count, timeout, f"{count} job(s) were running", manager=manager)
    return list(manager.running)


class Processes:
    """Every manager and subprocess a test starts, so teardown can end and reap them."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.managers: list[Manager] = []
        self.popens: list[tuple[subprocess.Popen[bytes], Path, IO[bytes]]] = []

    # -- managers in this process --------------------------------------------------

    def manager(self, queue: Queue | Sequence[Queue], *, start: bool = True, **settings: Any) -> Manager:
        """A manager on `queue` (or several) running the sample jobs, with FAST settings (started
        unless asked); a setting given as None is left to its default (or the queue's)."""
        given = {name: value for name, value in {**FAST, **settings}.items() if value is not None}
        manager = Manager(queue, sample_jobs.registry, **given)
        self.managers.append(manager)
        if start:
            manager.start()
        return manager

    # -- forkvisor subprocesses --------------------------------------------------------

    def forkvisor(self, *args: str, name: str = "forkvisor", prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Start `forkvisor ARGS...` from the repository root (behind `prefix`, a command
        that execs the rest, if given); its output goes to a log file."""
        log_path = self.tmp_path / f"{name}.{len(self.popens)}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115  # closed in teardown, after the process ends
        process = subprocess.Popen(
            [*prefix, *forkvisor_command(), "--log-format", "short", *args],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        self.popens.append((process, log_path, log_file))
        return process

    def run_manager(
        self, queue: Queue, *options: str, name: str = "manager", prefix: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        return self.forkvisor(
            "run", str(queue.path), "--app", APP, *APP_PATH, *FAST_CLI, *options, name=name, prefix=prefix
        )

    def log(self, process: subprocess.Popen[bytes]) -> str:
        for known, path, log_file in self.popens:
            if known is process:
                log_file.flush()
                return path.read_text(errors="replace")
        raise KeyError(process.pid)

    def wait_exit(self, process: subprocess.Popen[bytes], timeout: float, what: str) -> int:
        """Wait for a subprocess to exit; fail with its log if it does not in time."""
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            tail = self.log(process)[-4000:]
            pytest.fail(f"{what}: pid {process.pid} still running after {timeout:g}s (SIGKILLed); log:\n{tail}")

    # -- teardown ------------------------------------------------------------------

    def finish(self) -> list[str]:
        """End everything; return the problems found (leftover processes, by pid)."""
        problems = []
        for process, _, log_file in self.popens:
            if process.poll() is None:
                problems.append(f"subprocess pid {process.pid} ({process.args!r:.80}) was still running")
                process.kill()
                process.wait()
            log_file.close()
        for manager in self.managers:
            try:
                manager.close()
            except Exception as exc:
                problems.append(f"manager.close() raised {exc!r}")
                _force_close(manager)
        problems += reap_everything(timeout=5.0)
        return problems


def _force_close(manager: Manager) -> None:
    """What close() did not get to: kill its children, give this process its signals back."""
    for pid in [*manager.running, *(served.sweeper.pid for served in manager.served)]:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # gone already
    manager.running.clear()
    manager.wakeups.close()  # gives this process its signal handlers back


def forkvisor_command() -> list[str]:
    script = Path(sys.executable).with_name("forkvisor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "supervisor.cli"]


def reap_everything(timeout: float) -> list[str]:
    """Reap every child of this process; SIGKILL what still runs after `timeout`.

    Returns one problem per process that was still alive at the deadline.
    """
    me = psutil.Process()
    deadline = time.monotonic() + timeout
    give_up = deadline + 5.0
    problems: list[str] = []
    pause = 0.001
    while True:
        _reap_zombies()
        left = _descendants(me)
        living = [p for p in left if not is_gone(p.pid)]
        if not left:
            return problems
        if time.monotonic() >= give_up:
            return [*problems, *(f"pid {p.pid} could not be reaped: {_describe(p)}" for p in left)]
        if living and time.monotonic() >= deadline:
            for process in living:
                problems.append(f"pid {process.pid} was still alive after the test: {_describe(process)}")
                try:
                    process.kill()
                except psutil.Error:
                    pass  # it ended meanwhile
            deadline = float("inf")  # SIGKILLed: now just reap them
        time.sleep(pause)  # bounded teardown poll
        pause = min(pause * 2, 0.05)


def _descendants(me: psutil.Process) -> list[psutil.Process]:
    try:
        return me.children(recursive=True)
    except psutil.Error:
        return []


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _describe(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())[:120] or process.name()
    except psutil.Error:
        return "?"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    """Start managers and subprocesses through this; teardown ends and reaps them all,
    and fails naming any process that was still alive."""
    title = getproctitle()
    forking.become_subreaper()
    found = Processes(tmp_path)
    try:
        yield found
    finally:
        problems = found.finish()
        forking.become_subreaper(adopt=False)
        setproctitle(title)
    if problems:
        pytest.fail("teardown found leftovers (processes were SIGKILLed):\n" + "\n".join(problems))


@pytest.fixture
def queue(tmp_path: Path) -> Queue:
    return Queue(tmp_path / "queue", create=True)


@pytest.fixture
def barriers(tmp_path: Path) -> Path:
    """A folder for ready files, release files and pid lists."""
    folder = tmp_path / "barriers"
    folder.mkdir()
    return folder


def dump(found: Job) -> str:
    """Everything about a job, for an assertion message."""
    attempts = {a.number: a.outcome for a in found.history}
    return json.dumps(
        {"state": found.state.value, "attempts": found.attempts, "error": found.error, "outcomes": attempts},
        indent=1,
        default=str,
    )
