"""Forking for the process-level tests of the job store.

`children` forks a function into a real child process and reaps it with a
deadline. A child never returns into pytest: its body runs inside
try/finally and leaves through `os._exit`; an exception in it is written to
a file the parent reads back into the failure message. The parent stays
single-threaded and never sleeps blindly: waits are on a pidfd (or a
`waitpid(WNOHANG)` poll) bounded by a deadline, and a child still running at
the deadline or at teardown is SIGKILLed and the test fails naming its pid.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_until

CHILD_TIMEOUT = 20.0
EXIT_RAISED = 70  # the child's body raised; its traceback is in its .err file


def describe_status(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    if os.WIFEXITED(status):
        return f"exited with code {os.WEXITSTATUS(status)}"
    return f"status {status:#x}"


class Children:
    """Real child processes of one test, each reaped before the test ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.folder.mkdir(exist_ok=True)
        self.running: set[int] = set()

    def fork(self, body: Callable[[], None]) -> int:
        """Run `body()` in a forked child; exit 0 if it returns, EXIT_RAISED if it raises."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = EXIT_RAISED
            try:
                body()
                code = 0
            except BaseException:
                try:
                    with open(self.error_file(os.getpid()), "w") as file:
                        traceback.print_exc(file=file)
                except BaseException:
                    pass
            finally:
                os._exit(code)
        self.running.add(pid)
        return pid

    def error_file(self, pid: int) -> Path:
        return self.folder / f"child-{pid}.err"

    def error_of(self, pid: int) -> str:
        try:
            return self.error_file(pid).read_text()
        except FileNotFoundError:
            return "(no traceback recorded)"

    def wait(self, pid: int, timeout: float = CHILD_TIMEOUT) -> int:
        """Reap child `pid` and return its wait status; SIGKILL it and fail if it
        is still running after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        pidfd = _pidfd(pid)
        try:
            while True:
                found, status = os.waitpid(pid, os.WNOHANG)
                if found == pid:
                    self.running.discard(pid)
                    return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._kill(pid)
                    pytest.fail(f"child {pid} did not exit within {timeout:g}s; killed it with SIGKILL")
                if pidfd is not None:
                    select.select([pidfd], [], [], remaining)  # readable once the child has exited
                else:
                    select.select([], [], [], min(remaining, 0.005))
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def wait_ok(self, pid: int, timeout: float = CHILD_TIMEOUT) -> None:
        """Reap `pid` and fail, with its traceback, unless it exited with 0."""
        status = self.wait(pid, timeout)
        if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
            pytest.fail(f"child {pid} {describe_status(status)}:\n{self.error_of(pid)}")

    def wait_killed(self, pid: int, where: str, timeout: float = CHILD_TIMEOUT) -> None:
        """Reap `pid` and fail unless it died by SIGKILL (sent at `where`)."""
        status = self.wait(pid, timeout)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            pytest.fail(
                f"child {pid} {describe_status(status)} instead of dying by SIGKILL at {where}, "
                f"so that point was never reached:\n{self.error_of(pid)}"
            )

    def wait_stopped(self, pid: int, timeout: float = CHILD_TIMEOUT) -> None:
        """Wait until `pid` is stopped by a signal (it stays our child, to be continued)."""

        def stopped() -> bool:
            found, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
            if found == pid and not os.WIFSTOPPED(status):
                self.running.discard(pid)
                pytest.fail(f"child {pid} {describe_status(status)} instead of stopping:\n{self.error_of(pid)}")
            return found == pid

        try:
            wait_until(stopped, timeout, f"child {pid} stops")
        except pytest.fail.Exception as exc:
            self._kill(pid)
            pytest.fail(f"{exc}; killed it with SIGKILL")

    def reap_all(self) -> list[int]:
        """SIGKILL and reap every child still running; return their pids."""
        left = sorted(self.running)
        for pid in left:
            self._kill(pid)
        return left

    def _kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        self.running.discard(pid)


def _pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return int(opener(pid))
    except OSError:  # kernel older than 5.3, or seccomp said no: poll instead
        return None


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Children]:
    """Fork children; teardown SIGKILLs and reaps any left running, and fails."""
    found = Children(tmp_path / "children")
    yield found
    left = found.reap_all()
    if left:
        pytest.fail(f"children {left} were still running at teardown; killed them with SIGKILL")
