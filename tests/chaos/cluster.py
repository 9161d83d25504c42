"""The manager processes of a chaos run: start, find, kill, drain, restart, clean up.

Managers are real `forkvisor run` subprocesses (`python -m supervisor.cli`),
each in its own session so that cleanup can kill its whole group. While a
`Cluster` is open this process is a child subreaper, so whatever a SIGKILLed
manager orphans (its dying children, its jobs' grandchildren) comes back here:
it is reaped as it exits and killed at cleanup, and nothing escapes to init.

Processes are told apart by their titles (`setproctitle`): a manager's direct
children are its jobs ("forkvisor: job ID ...") and its sweeper
("forkvisor: sweeper ..."); grandchildren forked by chaos jobs retitle
themselves so they are never taken for jobs.
"""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

import psutil

REPO = Path(__file__).resolve().parents[2]
APP = "tests.chaos.behaviours:registry"
JOB_TITLE = "forkvisor: job "
SWEEPER_TITLE = "forkvisor: sweeper"
MANAGER_TITLE = "forkvisor: manager"
DRAIN_SLACK = 20.0  # beyond drain timeout + kill grace, for a loaded 2-core machine
OUTSTAY_SLACK = 8.0  # beyond the longest pause, for a loaded 2-core machine (`ManagerOptions.outstay_bound`)
_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ManagerOptions:
    """`forkvisor run` options: short leases, sweeps and grace so a run settles fast."""

    concurrency: int = 4
    lease: float = 5.0
    sweep_interval: float = 0.5
    kill_grace: float = 0.3
    poll_interval: float = 0.2
    drain_timeout: float = 0.5  # shorter than the hanging jobs' timeout, so drains stop (and release) some

    def cli(self) -> list[str]:
        options = {
            "--concurrency": self.concurrency,
            "--lease": self.lease,
            "--sweep-interval": self.sweep_interval,
            "--kill-grace": self.kill_grace,
            "--poll-interval": self.poll_interval,
            "--drain-timeout": self.drain_timeout,
        }
        return [text for option, value in options.items() for text in (option, str(value))]

    @property
    def drain_deadline(self) -> float:
        """How long a drained manager may take to exit before that is a problem."""
        return self.drain_timeout + self.kill_grace + DRAIN_SLACK

    @property
    def pause(self) -> float:
        """How long chaos SIGSTOPs a manager: past its lease, long enough for a sweeper to
        judge it expired and reap it."""
        return self.lease + 2 * self.sweep_interval + 0.5

    @property
    def outstay_bound(self) -> float:
        """How long a process of a run may outlive its run's end while a manager lives on the
        host. The longest legitimate wait is a paused manager's: its job ended (timed out, or
        SIGKILLed by chaos) just as it was SIGSTOPped, so the run's cgroup is killed when it
        resumes and reaps the job, or when a sweeper reaps it past its lease, whichever is
        first. Every other end is at once: the manager reaps its job and kills the rest; a
        SIGKILLed manager's runs are ended by a live manager's sweeper (within a sweep) or by
        its successor as it starts (`containment.clear_dead_owners`). The slack is for a
        loaded machine (a successor's start, a sweep that runs late)."""
        return self.pause + OUTSTAY_SLACK


@dataclass
class ManagerProcess:
    """One incarnation of a manager slot."""

    slot: int
    incarnation: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    started_at: float  # time.monotonic() when it was spawned (CLOCK_MONOTONIC, as jobs see it)
    fates: list[str] = field(default_factory=list)  # what we did to it: killed, drained, stopped-now
    killed_at: float | None = None  # when we SIGKILLed it
    ended_at: float | None = None  # when we found it exited
    signalled_at: float | None = None  # when we asked it to drain or stop
    resume_at: float | None = None  # when to SIGCONT it, while SIGSTOPped

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def name(self) -> str:
        return f"manager {self.slot}.{self.incarnation} (pid {self.pid})"

    def alive(self) -> bool:
        return self.popen.poll() is None

    def expected_exit(self) -> set[int]:
        """The exit statuses that match what we did to it."""
        expected = set()
        if "killed" in self.fates:
            expected.add(-signal.SIGKILL)
        if {"drained", "stopped-now", "stopped"} & set(self.fates):
            expected.add(0)
        return expected

    def log_tail(self, size: int = 3000) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")[-size:]


class Cluster:
    """Several managers serving one queue, restarted whenever they exit."""

    def __init__(
        self,
        queue: Path,
        logs: Path,
        options: ManagerOptions,
        managers: int,
        rng: random.Random,
        note: Callable[[str], None],
    ) -> None:
        self.queue = queue
        self.logs = logs
        self.options = options
        self.slots = managers
        self.rng = rng
        self.note = note  # the chaos log
        self.current: dict[int, ManagerProcess] = {}
        self.finished: list[ManagerProcess] = []
        self.restart_at: dict[int, float] = {}
        self.problems: list[str] = []
        self.restarts = 0
        self.bursts: list[tuple[float, float]] = []  # when each `--burst` manager started and ended
        self._was_subreaper = 0

    # -- life cycle ----------------------------------------------------------------

    def __enter__(self) -> Cluster:
        found = ctypes.c_int(0)
        _libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(found), 0, 0, 0)
        self._was_subreaper = found.value
        _libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self.cleanup()
        finally:
            _libc.prctl(_PR_SET_CHILD_SUBREAPER, self._was_subreaper, 0, 0, 0)

    def start_all(self) -> None:
        for slot in range(self.slots):
            self.start(slot)

    def start(self, slot: int) -> ManagerProcess:
        incarnation = sum(1 for done in self.finished if done.slot == slot)
        started = time.monotonic()
        process = self._spawn(f"manager-{slot}.{incarnation}", ["run", str(self.queue), "--app", APP])
        self.current[slot] = ManagerProcess(slot, incarnation, *process, started_at=started)
        self.note(f"start {self.current[slot].name}")
        return self.current[slot]

    def _spawn(self, name: str, args: list[str]) -> tuple[subprocess.Popen[bytes], Path, IO[bytes]]:
        log_path = self.logs / f"{name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115  # closed at cleanup, once the process has ended
        command = [sys.executable, "-m", "supervisor.cli", *args]
        if args[0] == "run":
            command += self.options.cli()
        popen = subprocess.Popen(
            command,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return popen, log_path, log_file

    # -- keeping it running ------------------------------------------------------------

    def tend(self, restart: bool = True) -> None:
        """Reap orphans, judge managers that exited, restart the slots whose time has come,
        and stop drains that take too long."""
        reap_orphans({process.pid for process in self._all()})
        now = time.monotonic()
        for slot, process in list(self.current.items()):
            if not process.alive():
                self._exited(process, now)
                del self.current[slot]
            elif process.signalled_at is not None and now > process.signalled_at + self.options.drain_deadline:
                self.problems.append(
                    f"{process.name} did not exit within {self.options.drain_deadline:g}s of {process.fates}"
                )
                process.signalled_at = None  # reported once; the SIGKILL ends it
                self.kill(process)
        self._resume_due(now)
        for slot, when in list(self.restart_at.items()):
            if restart and now >= when and slot not in self.current:
                del self.restart_at[slot]
                self.restarts += 1
                self.start(slot)

    def _resume_due(self, now: float) -> None:
        for process in self.current.values():
            if process.resume_at is not None and now >= process.resume_at:
                self.resume(process)

    def _exited(self, process: ManagerProcess, now: float) -> None:
        code = process.popen.returncode
        process.ended_at = now
        self.note(f"{process.name} exited {code} after {process.fates or 'nothing'}")
        if code not in process.expected_exit():
            self.problems.append(
                f"{process.name} exited {code} after {process.fates or 'nothing done to it'}; log tail:\n"
                + process.log_tail()
            )
        self.finished.append(process)
        self.restart_at[process.slot] = now + self.rng.uniform(0.05, 0.5)

    def _all(self) -> list[ManagerProcess]:
        return [*self.finished, *self.current.values()]

    def lives(self) -> list[tuple[int | None, float, float]]:
        """(pid, start, end) of every manager so far, the `--burst` ones too (pid None); the
        end of one still running is now."""
        now = time.monotonic()
        managers = [(p.pid, p.started_at, now if p.ended_at is None else p.ended_at) for p in self._all()]
        return managers + [(None, start, end) for start, end in self.bursts]

    # -- finding processes ------------------------------------------------------------

    def serving(self) -> list[ManagerProcess]:
        """Managers that finished starting (signal handling is installed), neither paused nor
        asked to stop: a SIGTERM now starts a drain."""
        return [
            process
            for process in self.current.values()
            if process.signalled_at is None and process.resume_at is None and _is_serving(process.pid)
        ]

    def alive(self) -> list[ManagerProcess]:
        return [process for process in self.current.values() if process.alive()]

    def unpaused(self) -> list[ManagerProcess]:
        return [process for process in self.alive() if process.resume_at is None]

    def children_titled(self, prefix: str) -> list[tuple[ManagerProcess, psutil.Process]]:
        found = []
        for process in self.alive():
            for child in _children(process.pid):
                if title(child).startswith(prefix):
                    found.append((process, child))
        return found

    # -- what chaos does to them ------------------------------------------------------

    def kill(self, process: ManagerProcess) -> None:
        process.fates.append("killed")
        process.killed_at = time.monotonic()
        _signal(process.pid, signal.SIGKILL)

    def pause(self, process: ManagerProcess, seconds: float) -> None:
        """SIGSTOP it for `seconds` (`tend` resumes it): past its lease, a sweeper reaps its claims
        while its children run on, and once resumed it must find itself fenced out."""
        process.fates.append("paused")
        process.resume_at = time.monotonic() + seconds
        _signal(process.pid, signal.SIGSTOP)

    def resume(self, process: ManagerProcess) -> None:
        process.resume_at = None
        _signal(process.pid, signal.SIGCONT)
        self.note(f"SIGCONT {process.name}")

    def drain(self, process: ManagerProcess) -> None:
        process.fates.append("drained")
        process.signalled_at = time.monotonic()
        _signal(process.pid, signal.SIGTERM)

    def stop_now(self, process: ManagerProcess, timeout: float) -> None:
        """Two SIGTERMs: the second one means stop now (running jobs are killed and released).
        The second waits until the first was handled: two pending SIGTERMs merge into one."""
        process.fates.append("stopped-now")
        process.signalled_at = time.monotonic()
        _signal(process.pid, signal.SIGTERM)
        handled = lambda: _is_draining(process.pid) or not process.alive()  # noqa: E731
        try:
            wait_for(handled, timeout, f"{process.name} handled its first SIGTERM", lambda: None)
        except TimeoutError:
            return  # tend() will find it hung
        if process.alive():  # else it had nothing running and exited at once
            _signal(process.pid, signal.SIGTERM)

    def drain_all(self, timeout: float) -> int:
        """`forkvisor drain QUEUE`: every manager must drain (call it once all have started:
        one that starts after the request takes it as stale). Return the command's exit code."""
        for process in self.alive():
            process.fates.append("drained")
            process.signalled_at = time.monotonic()
        return self.run_command(["drain", str(self.queue)], "drain", timeout)

    def all_started(self) -> bool:
        """Every slot has a manager past its start (its title says so), whatever was done to it."""
        alive = self.alive()
        return len(alive) == self.slots and all(_is_serving(process.pid) for process in alive)

    def stop_all(self, timeout: float) -> None:
        """SIGTERM every manager (once each has started) and wait until all have exited."""
        self.restart_at.clear()
        for process in self.current.values():
            if process.resume_at is not None:
                self.resume(process)
        wait_for(lambda: self._started_or_gone(), timeout, "every manager finished starting", self.tend_no_restart)
        for process in self.alive():
            if "drained" not in process.fates:
                process.fates.append("stopped")
                process.signalled_at = time.monotonic()
                _signal(process.pid, signal.SIGTERM)
        wait_for(lambda: not self.current, timeout, "every manager exited after SIGTERM", self.tend_no_restart)

    def tend_no_restart(self) -> None:
        self.tend(restart=False)
        self.restart_at.clear()

    def _started_or_gone(self) -> bool:
        return all(
            process.fates or _is_serving(process.pid) or not process.alive() for process in self.current.values()
        )

    def run_command(self, args: list[str], name: str, timeout: float) -> int:
        """Run `forkvisor ARGS` to the end (a burst manager, a drain request); return its exit code."""
        started = time.monotonic()
        popen, log_path, log_file = self._spawn(name, args)
        try:
            code = popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            code = popen.wait()
            self.problems.append(f"forkvisor {' '.join(args[:1])} did not finish within {timeout:g}s")
        finally:
            log_file.close()
            if args[0] == "run":
                self.bursts.append((started, time.monotonic()))
        if code != 0:
            self.problems.append(f"forkvisor {' '.join(args)} exited {code}: {log_path.read_text()[-3000:]}")
        return code

    # -- cleanup ---------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Kill every manager's group and every descendant left, reap them all, close the logs."""
        for process in self.current.values():
            if process.alive():
                _signal_group(process.pid, signal.SIGKILL)
        for process in self._all():
            try:
                process.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.problems.append(f"{process.name} could not be reaped")
            process.log_file.close()
        self.problems += kill_descendants(timeout=10.0)


# -- helpers -------------------------------------------------------------------------


def wait_for(condition: Callable[[], object], timeout: float, what: str, tend: Callable[[], None]) -> None:
    """Poll `condition`, tending the cluster meanwhile; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting until {what}")
        tend()
        time.sleep(pause)  # the backoff of a poll bounded by `deadline`
        pause = min(pause * 2, 0.05)


def title(process: psutil.Process) -> str:
    """The process title as `ps` shows it."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def _is_serving(pid: int) -> bool:
    try:
        return title(psutil.Process(pid)).startswith(MANAGER_TITLE)
    except psutil.Error:
        return False


def _is_draining(pid: int) -> bool:
    """The manager's title says " draining" once it has handled a drain request."""
    try:
        return title(psutil.Process(pid)).endswith(" draining")
    except psutil.Error:
        return False


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children()
    except psutil.Error:
        return []


def _signal(pid: int, signum: signal.Signals) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass  # it exited meanwhile; tend() judges its exit


def _signal_group(pid: int, signum: signal.Signals) -> None:
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        pass  # the group is gone already


def reap_orphans(known: set[int]) -> None:
    """Reap exited children of this process that are not managers (Popen reaps those)."""
    for child in _children(os.getpid()):
        if child.pid in known:
            continue
        try:
            os.waitpid(child.pid, os.WNOHANG)
        except ChildProcessError:
            pass  # not ours to reap after all (reaped meanwhile)


def kill_descendants(timeout: float) -> list[str]:
    """SIGKILL every process below this one and reap it; name those that would not go."""
    deadline = time.monotonic() + timeout
    while True:
        left = psutil.Process().children(recursive=True)
        for process in left:
            try:
                process.kill()
            except psutil.Error:
                pass  # it ended meanwhile
        reap_orphans(set())
        if not left:
            return []
        if time.monotonic() > deadline:
            return [f"pid {process.pid} ({title(process)}) survived cleanup" for process in left]
        time.sleep(0.01)  # a bounded poll while the kernel delivers SIGKILL
