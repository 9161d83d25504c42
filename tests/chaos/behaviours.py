"""The jobs of the chaos run, one registered function per way a real job behaves.

Managers load them with `--app tests.chaos.behaviours:registry` (run from the
repository root). `BEHAVIOURS` says, for each function, how often it is in the
mix, how it ends when nothing outside interferes, and the signature (see
`checker.signature`) of a run that fails by the job's own doing, so the
checker can tell those from runs that chaos killed.

Every job takes a `token` (unique per job) and returns it in its result, so a
result can never be mistaken for another job's. Timeouts and backoffs are
short so that thousands of jobs settle within minutes.

Every run of every job first takes its job's lock (`_one_run_at_a_time`), an
`flock` on a file of its own that every process the run forks shares: a run
that finds it taken started while a process of an earlier run of its job
lived, which containment must never let happen (an OVERLAP record). The
long-lived grandchildren of `chaos.fork_hang` witness their job's end: they
note, while they live after it, how long they have outlived it (`_live`).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import json
import os
import random
import resource
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psutil
import tenacity
from setproctitle import setproctitle

from jobs import CannotComplete, Registry, current

registry = Registry()
F = TypeVar("F", bound=Callable[..., Any])
NAMES: dict[Callable[..., Any], str] = {}  # each job function's registered name


def _job(name: str, **policy: Any) -> Callable[[F], F]:
    """`registry.job(name=name, ...)` of the function run alone (`_one_run_at_a_time`),
    remembering the name (the behaviours refer to it)."""

    def register(function: F) -> F:
        @functools.wraps(function)  # (its signature too: the registry checks arguments against it)
        def run_alone(*args: Any, **kwargs: Any) -> Any:
            _one_run_at_a_time(kwargs.get("token", "?"))
            return function(*args, **kwargs)

        NAMES[run_alone] = name
        return registry.job(name=name, **policy)(run_alone)  # type: ignore[return-value]

    return register


HANG_TIMEOUT = 1.0  # jobs that hang are stopped this soon, so they do not hold slots for long
SAFETY_TIMEOUT = 60.0  # jobs that should finish at once still never hold a slot forever
QUICK_RETRY = tenacity.wait_random(0.02, 0.2)
SHORT_LIFETIME = 0.2  # grandchildren of a succeeding job end by themselves this soon
LONG_LIFETIME = 30.0  # grandchildren of a hanging job live this long unless their job's tree is killed
RECORD_WAIT = 10.0  # a forking job waits at most this long for its grandchildren to announce themselves
WITNESS_EVERY = 0.25  # a grandchild that outlives its job notes it this often (`_live`)
OVERLAP = "OVERLAP"  # a run of a job found a process of an earlier run alive: OVERLAP.TOKEN.RUN.PID
SURVIVED = ".survived"  # a grandchild that lived its whole life leaves PID.survived beside its record
OUTLIVED = ".outlived"  # a grandchild alive after its job ended: PID.outlived (when it ended, when last alive)
EXIT_CODES = (1, 2, 3, 42, 99, 101, 127, 255)  # not 0, 70, 71 or 100: forkvisor gives those a meaning


@dataclass(frozen=True)
class Scratch:
    """Folders beside the queue (never in it) where jobs leave traces for the run to read."""

    root: Path

    @classmethod
    def beside(cls, queue: Path) -> Scratch:
        """The scratch space of the run whose queue is `queue` (a job finds it from its own)."""
        return cls(queue.parent / "scratch")

    @property
    def markers(self) -> Path:
        """chaos.flaky's "I failed once already" markers."""
        return self.root / "markers"

    @property
    def grandchildren(self) -> Path:
        """One JSON record per grandchild forked by chaos.fork and chaos.fork_hang."""
        return self.root / "grandchildren"

    @property
    def runs(self) -> Path:
        """One lock file per job, held by every process of its current run (`_one_run_at_a_time`)."""
        return self.root / "runs"

    @property
    def overlaps(self) -> Path:
        """One OVERLAP record per run that started while a process of an earlier run lived."""
        return self.root / "overlaps"

    def create(self) -> None:
        for folder in (self.markers, self.grandchildren, self.runs, self.overlaps):
            folder.mkdir(parents=True, exist_ok=True)


# -- the jobs ----------------------------------------------------------------


@_job("chaos.succeed", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def succeed(token: str) -> dict[str, Any]:
    return {"token": token}


@_job("chaos.raise", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def raise_always(token: str) -> NoReturn:
    raise RuntimeError(f"chaos job {token} raises on every run")


@_job("chaos.flaky", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def flaky(token: str, marker: str) -> dict[str, Any]:
    """Raise on the first run that gets this far, succeed on every later one."""
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return {"token": token}
    raise RuntimeError(f"chaos job {token} fails its first run")


@_job("chaos.exit", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def exit_hard(token: str, code: int) -> NoReturn:
    os._exit(code)


@_job("chaos.segv", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def segfault(token: str) -> NoReturn:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # core_pattern may write cores into the cwd
    ctypes.string_at(0)  # a real SIGSEGV, not a signal sent to ourselves
    raise AssertionError("still alive after reading address 0")


@_job("chaos.hang", timeout=HANG_TIMEOUT, max_attempts=2, backoff=QUICK_RETRY)
def hang(token: str) -> NoReturn:
    _block_forever()


@_job("chaos.ignore_term", timeout=HANG_TIMEOUT, max_attempts=2, backoff=QUICK_RETRY)
def ignore_term(token: str) -> NoReturn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _block_forever()


@_job("chaos.fork", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def fork(token: str, grandchildren: str) -> dict[str, Any]:
    """Fork two short-lived grandchildren (one leaves the process group), then succeed."""
    pids = [_grandchild(grandchildren, token, SHORT_LIFETIME, leave_group=n == 0, ignore_term=False) for n in range(2)]
    _wait_for_records(grandchildren, pids)
    return {"token": token, "grandchildren": pids}


@_job("chaos.fork_hang", timeout=HANG_TIMEOUT, max_attempts=2, backoff=QUICK_RETRY)
def fork_hang(token: str, grandchildren: str) -> NoReturn:
    """Fork two grandchildren that ignore SIGTERM (one leaves the process group), then hang:
    only a kill of the whole tree at the timeout ends them before LONG_LIFETIME. First, look
    for what an earlier run of this job left alive: a run must never overlap its retry.
    The grandchildren watch this process through a pidfd, to witness how long they outlive it."""
    _record_overlaps(token)
    job_end = os.pidfd_open(os.getpid())  # readable once this process has ended: the run's end
    pids = [
        _grandchild(grandchildren, token, LONG_LIFETIME, leave_group=n == 0, ignore_term=True, job_end=job_end)
        for n in range(2)
    ]
    _wait_for_records(grandchildren, pids)
    _block_forever()


@_job("chaos.stdout", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def flood_stdout(token: str, size: int) -> dict[str, Any]:
    """Write `size` bytes to stdout, in 1 KiB lines through sys.stdout."""
    line = (token * 1024)[:1023] + "\n"
    for _ in range(size // 1024):
        sys.stdout.write(line)
    return {"token": token, "bytes": size // 1024 * 1024}


@_job("chaos.bad_return", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def bad_return(token: str, kind: str) -> object:
    values: dict[str, object] = {"object": object(), "nan": float("nan"), "set": {token}}
    return {"token": token, "value": values[kind]}


@_job("chaos.cannot", timeout=SAFETY_TIMEOUT, backoff=QUICK_RETRY)
def cannot(token: str) -> NoReturn:
    raise CannotComplete(f"chaos job {token} can never be completed")


# -- helpers run inside the jobs -------------------------------------------------


def _block_forever() -> NoReturn:
    while True:
        signal.pause()


def _grandchild(
    folder: str, token: str, lifetime: float, *, leave_group: bool, ignore_term: bool, job_end: int | None = None
) -> int:
    """Fork a grandchild that records itself in `folder`, lives `lifetime` seconds (`_live`),
    then exits."""
    job = psutil.Process()
    about = {"token": token, "job": job.pid, "job_started": job.create_time(), "manager": os.getppid()}
    pid = os.fork()
    if pid == 0:
        try:
            if leave_group:
                os.setsid()
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            setproctitle(f"chaos: grandchild of job {token}")  # so no one takes it for a job child
            me = psutil.Process()
            record = {**about, "pid": me.pid, "started": me.create_time(), "lifetime": lifetime}
            _write_atomically(Path(folder, str(me.pid)), record)
            _live(lifetime, job_end, Path(folder, f"{me.pid}{OUTLIVED}"))
            Path(folder, f"{me.pid}{SURVIVED}").touch()
        finally:
            os._exit(0)
    return pid


def _live(lifetime: float, job_end: int | None, outlived: Path) -> None:
    """Live `lifetime` seconds: the test is whether someone kills us sooner. Once the job's
    process has ended (`job_end`, a pidfd of it, is readable), note every WITNESS_EVERY seconds
    in `outlived` when it ended and that we are still alive (CLOCK_MONOTONIC: the chaos run
    reads the same clock), so the run can tell by how long we outlived our run's end."""
    until = time.monotonic() + lifetime
    if job_end is not None and select.select([job_end], [], [], lifetime)[0]:
        ended = time.monotonic()
        while (now := time.monotonic()) < until:
            _write_atomically(outlived, {"job_ended": ended, "alive_at": now})
            time.sleep(min(WITNESS_EVERY, until - now))
    time.sleep(max(0.0, until - time.monotonic()))


def _one_run_at_a_time(token: str) -> None:
    """Take this job's lock (an `flock` on `Scratch.runs/JOB_ID`) for the rest of the run: the
    descriptor stays open, and every process the run forks shares it, so the lock is free
    only once every process of the run has ended (a zombie holds nothing). A run that finds
    it taken leaves an OVERLAP record naming the run that holds it, and goes on."""
    job = current()
    scratch = Scratch.beside(job.queue_path)
    run = job.run_path.name.removeprefix("attempt-")
    lock = os.open(scratch.runs / job.job_id, os.O_RDWR | os.O_CREAT, 0o600)  # never closed: held to the end
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(lock, 4096, 0).decode(errors="replace") or "a run that had not yet said which"
        about = (
            f"run {run} of job {job.job_id} ({token}) started while a process of an earlier run "
            f"held its lock ({holder})"
        )
        _write_atomically(scratch.overlaps / f"{OVERLAP}.{token}.{run}.{os.getpid()}", {"about": about})
        return
    os.ftruncate(lock, 0)
    os.pwrite(lock, f"run {run}, pid {os.getpid()}".encode(), 0)


def _record_overlaps(token: str) -> None:
    """Leave `OVERLAP.TOKEN.title.PID` for each grandchild of an earlier run of this job still
    alive (found by its title, as anyone could, knowing nothing of how forkvisor tracks runs;
    the lock of `_one_run_at_a_time` finds it too, and any other process of an earlier run)."""
    title = f"chaos: grandchild of job {token}"
    overlaps = Scratch.beside(current().queue_path).overlaps
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            words = process.info["cmdline"] or []
            if " ".join(words).strip() == title and process.info["status"] != psutil.STATUS_ZOMBIE:
                about = f"a run of job {token} started while pid {process.pid}, a grandchild of an earlier run, lived"
                _write_atomically(overlaps / f"{OVERLAP}.{token}.title.{process.pid}", {"about": about})
        except psutil.Error:
            continue  # gone meanwhile


def _wait_for_records(folder: str, pids: list[int]) -> None:
    deadline = time.monotonic() + RECORD_WAIT
    while not all(Path(folder, str(pid)).exists() for pid in pids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"grandchildren {pids} did not record themselves in {folder}")
        time.sleep(0.005)  # a bounded poll for our own grandchildren


def _write_atomically(path: Path, document: Mapping[str, Any]) -> None:
    staging = path.with_name(f".{path.name}.tmp")
    staging.write_text(json.dumps(document))
    os.replace(staging, path)


# -- the mix -------------------------------------------------------------------


def _token_only(rng: random.Random, token: str, scratch: Scratch) -> dict[str, Any]:
    return {"token": token}


@dataclass(frozen=True)
class Behaviour:
    """One function of the mix and what the checker should expect of it."""

    function: Callable[..., Any]
    weight: int
    succeeds: bool  # ends in done/ when nothing outside interferes
    failure: Callable[[Mapping[str, Any]], str] | None = None  # signature of its own failed run, from its kwargs
    own_failures: int = 0  # for a job that succeeds: how many of its runs may fail by its own doing first
    permanent: bool = False  # its own failure sends it to dead/ at once (CannotComplete)
    arguments: Callable[[random.Random, str, Scratch], dict[str, Any]] = _token_only

    @property
    def name(self) -> str:
        return NAMES[self.function]


def _fixed(text: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda kwargs: text


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(succeed, weight=28, succeeds=True),
    Behaviour(raise_always, weight=7, succeeds=False, failure=_fixed("exited 1 RuntimeError")),
    Behaviour(
        flaky,
        weight=10,
        succeeds=True,
        failure=_fixed("exited 1 RuntimeError"),
        own_failures=1,
        arguments=lambda rng, token, scratch: {"token": token, "marker": str(scratch.markers / token)},
    ),
    Behaviour(
        exit_hard,
        weight=7,
        succeeds=False,
        failure=lambda kwargs: f"exited {kwargs['code']} Crashed",
        arguments=lambda rng, token, scratch: {"token": token, "code": rng.choice(EXIT_CODES)},
    ),
    Behaviour(segfault, weight=5, succeeds=False, failure=_fixed("killed by SIGSEGV Crashed")),
    Behaviour(hang, weight=4, succeeds=False, failure=_fixed("timeout: killed by SIGTERM Timeout")),
    Behaviour(ignore_term, weight=3, succeeds=False, failure=_fixed("timeout: killed by SIGKILL Timeout")),
    Behaviour(
        fork,
        weight=7,
        succeeds=True,
        arguments=lambda rng, token, scratch: {"token": token, "grandchildren": str(scratch.grandchildren)},
    ),
    Behaviour(
        fork_hang,
        weight=2,
        succeeds=False,
        failure=_fixed("timeout: killed by SIGTERM Timeout"),
        arguments=lambda rng, token, scratch: {"token": token, "grandchildren": str(scratch.grandchildren)},
    ),
    Behaviour(
        flood_stdout,
        weight=6,
        succeeds=True,
        arguments=lambda rng, token, scratch: {"token": token, "size": rng.randrange(64, 1024) * 1024},
    ),
    Behaviour(
        bad_return,
        weight=7,
        succeeds=False,
        failure=_fixed("exited 1 TypeError"),
        arguments=lambda rng, token, scratch: {"token": token, "kind": rng.choice(["object", "nan", "set"])},
    ),
    Behaviour(cannot, weight=7, succeeds=False, failure=_fixed("exited 100 CannotComplete"), permanent=True),
)
BY_NAME: dict[str, Behaviour] = {behaviour.name: behaviour for behaviour in BEHAVIOURS}
