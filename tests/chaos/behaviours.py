"""The jobs of the chaos run, one registered function per way a real job behaves.

Managers load them with `--app tests.chaos.behaviours:registry` (run from the
repository root). `BEHAVIOURS` says, for each function, how often it is in the
mix, how it ends when nothing outside interferes, and the signature (see
`checker.signature`) of a run that fails by the job's own doing, so the
checker can tell those from runs that chaos killed.

Every job takes a `token` (unique per job) and returns it in its result, so a
result can never be mistaken for another job's. Timeouts and backoffs are
short so that thousands of jobs settle within minutes.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import resource
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

from jobs import CannotComplete, Registry

registry = Registry()
F = TypeVar("F", bound=Callable[..., Any])
NAMES: dict[Callable[..., Any], str] = {}  # each job function's registered name


def _job(name: str, **policy: Any) -> Callable[[F], F]:
    """`registry.job(name=name, ...)`, remembering the name (the behaviours refer to it)."""

    def register(function: F) -> F:
        NAMES[function] = name
        return registry.job(name=name, **policy)(function)

    return register


HANG_TIMEOUT = 1.0  # jobs that hang are stopped this soon, so they do not hold slots for long
SAFETY_TIMEOUT = 60.0  # jobs that should finish at once still never hold a slot forever
QUICK_RETRY = tenacity.wait_random(0.02, 0.2)
SHORT_LIFETIME = 0.2  # grandchildren of a succeeding job end by themselves this soon
LONG_LIFETIME = 30.0  # grandchildren of a hanging job live this long unless their job's tree is killed
RECORD_WAIT = 10.0  # a forking job waits at most this long for its grandchildren to announce themselves
OVERLAP = "OVERLAP"  # a run of a job found a grandchild of an earlier run alive: OVERLAP.TOKEN.PID
SURVIVED = ".survived"  # a grandchild that lived its whole life leaves PID.survived beside its record
EXIT_CODES = (1, 2, 3, 42, 99, 101, 127, 255)  # not 0, 70, 71 or 100: forkvisor gives those a meaning


@dataclass(frozen=True)
class Scratch:
    """Folders outside the queue where jobs leave traces for the run to read."""

    markers: Path  # chaos.flaky's "I failed once already" markers
    grandchildren: Path  # one JSON record per grandchild forked by chaos.fork and chaos.fork_hang

    def create(self) -> None:
        self.markers.mkdir(parents=True, exist_ok=True)
        self.grandchildren.mkdir(parents=True, exist_ok=True)


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
    for what an earlier run of this job left alive: a run must never overlap its retry."""
    _record_overlaps(grandchildren, token)
    pids = [_grandchild(grandchildren, token, LONG_LIFETIME, leave_group=n == 0, ignore_term=True) for n in range(2)]
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


def _grandchild(folder: str, token: str, lifetime: float, *, leave_group: bool, ignore_term: bool) -> int:
    """Fork a grandchild that records itself in `folder`, lives `lifetime` seconds, then exits."""
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
            time.sleep(lifetime)  # its whole life: the test is whether someone kills it sooner
            Path(folder, f"{me.pid}{SURVIVED}").touch()
        finally:
            os._exit(0)
    return pid


def _record_overlaps(folder: str, token: str) -> None:
    """Leave `OVERLAP.TOKEN.PID` for each grandchild of an earlier run of this job still alive
    (found by its title, as anyone could, knowing nothing of how forkvisor tracks runs)."""
    title = f"chaos: grandchild of job {token}"
    for process in psutil.process_iter(["cmdline", "status"]):
        try:
            words = process.info["cmdline"] or []
            if " ".join(words).strip() == title and process.info["status"] != psutil.STATUS_ZOMBIE:
                _write_atomically(Path(folder, f"{OVERLAP}.{token}.{process.pid}"), {"pid": process.pid})
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
