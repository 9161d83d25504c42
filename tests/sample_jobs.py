"""Callables the supervisor tests enqueue, registered by explicit name.

A manager loads them with `--app tests.sample_jobs:registry` (run from the
repository root). Each one behaves in one way a real job can: succeed, raise,
exit hard, crash, hang, ignore SIGTERM, leave the process group, eat memory.

Barriers: a blocking job first announces itself by writing its pid to a
`ready` file (write then rename, so a reader never sees half a pid), then
blocks in `signal.pause()`. Tests wait for that file instead of sleeping.
Jobs that must finish on cue wait for a `release` file the test creates.
"""

from __future__ import annotations

import faulthandler
import os
import random
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import tenacity

from jobs import CannotComplete, Registry, current

registry = Registry()

RELEASE_POLL = 0.005  # how often a job waiting for its release file looks for it


def announce(path: str | os.PathLike[str], text: str | None = None) -> None:
    """Write `text` (default: this pid) to `path` atomically: write a temporary, then rename."""
    target = Path(path)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    staging.write_text(f"{os.getpid() if text is None else text}\n")
    os.replace(staging, target)


def block_forever() -> NoReturn:
    while True:
        signal.pause()


def wait_for_file(path: str | os.PathLike[str]) -> None:
    """The job's side of a release barrier: return once `path` exists."""
    while not os.path.exists(path):
        time.sleep(RELEASE_POLL)


@registry.job(name="sample.ok")
def ok(value: Any = None) -> dict[str, Any]:
    os.write(1, f"sample.ok running with {value!r}\n".encode())
    return {"value": value, "pid": os.getpid()}


@registry.job(name="sample.nap")
def nap(seconds: float) -> float:
    """Run for a while (a long job), then succeed."""
    time.sleep(seconds)
    return seconds


@registry.job(name="sample.declared", max_attempts=2, timeout="0.5s", backoff="fixed 0.3s")
def declared(seconds: float) -> float:
    """A job whose registration declares its whole policy: the tests of every way to submit
    it check that the manager enforces exactly this (tests/supervisor/test_policy_paths.py)."""
    time.sleep(seconds)
    return seconds


@registry.job(name="sample.fail", max_attempts=2, backoff=tenacity.wait_fixed(0.1))
def fail(message: str) -> NoReturn:
    raise ValueError(message)


@registry.job(name="sample.print_and_fail", max_attempts=1)
def print_and_fail(text: str) -> NoReturn:
    """Print to stdout and stderr through `sys`, then raise."""
    print(f"stdout says {text}", flush=True)
    raise RuntimeError(f"failing after printing {text}")


@registry.job(name="sample.exit3")
def exit3() -> NoReturn:
    os._exit(3)


@registry.job(name="sample.segv")
def segv() -> NoReturn:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's folder
    faulthandler.enable(file=2)  # fd 2 is the attempt's stderr
    faulthandler._sigsegv()
    raise AssertionError("still alive after SIGSEGV")


@registry.job(name="sample.cannot")
def cannot(reason: str) -> NoReturn:
    raise CannotComplete(reason)


@registry.job(name="sample.bad_return")
def bad_return() -> object:
    return object()


@registry.job(name="sample.hygiene")
def hygiene() -> dict[str, Any]:
    """Report what the child inherited: descriptors, signal mask and handlers, random state."""
    fds = _descriptors()
    handled = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD, signal.SIGHUP)
    wakeup_fd = signal.set_wakeup_fd(-1)
    return {
        "pid": os.getpid(),
        "pgid": os.getpgrp(),
        "fds": fds,
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "default_handlers": {s.name: signal.getsignal(s) == signal.SIG_DFL for s in handled},
        "wakeup_fd": wakeup_fd,
        "random": random.getrandbits(64),
    }


@registry.job(name="sample.own_cgroup")
def own_cgroup() -> dict[str, Any]:
    """The job's cgroup v2, as /proc names it, and what its descriptors point to."""
    with open("/proc/self/cgroup") as groups:
        v2 = next(line[3:].rstrip("\n") for line in groups if line.startswith("0::"))
    return {"cgroup": v2, "fds": _descriptors()}


def _descriptors() -> dict[str, str]:
    """What each of this process's descriptors points to, as /proc shows it."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            fds[name] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # the descriptor listdir itself used
    return fds


@registry.job(name="sample.exit_with")
def exit_with(how: str) -> NoReturn:
    """Leave through sys.exit(0), sys.exit(5) or KeyboardInterrupt."""
    if how == "interrupt":
        raise KeyboardInterrupt
    sys.exit(int(how))


@registry.job(name="sample.block")
def block(ready: str) -> NoReturn:
    announce(ready)
    block_forever()


@registry.job(name="sample.ignore_term_block")
def ignore_term_block(ready: str) -> NoReturn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    announce(ready)
    block_forever()


@registry.job(name="sample.wait_release")
def wait_release(ready: str, release: str) -> str:
    """Announce, then finish once the test creates `release`."""
    announce(ready)
    wait_for_file(release)
    return "released"


@registry.job(name="sample.chatty")
def chatty(megabytes: int, written: str, release: str) -> int:
    """Write `megabytes` MiB of numbered lines to stdout (each line says its own offset, so
    a test can tell what was kept), announce it, finish once released."""
    offset, total, block = 0, megabytes << 20, bytearray()
    while offset < total:
        block += b"%015d chatty\n" % (offset + len(block))
        if len(block) >= 1 << 16:
            offset += os.write(1, block)
            block.clear()
    announce(written, str(offset))
    wait_for_file(release)
    return offset


@registry.job(name="sample.whoami")
def whoami() -> dict[str, Any]:
    """Who the job's process is: its user, group, groups, and what its environment says."""
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "user": os.environ.get("USER"),
        "home": os.environ.get("HOME"),
    }


@registry.job(name="sample.environment")
def environment() -> dict[str, str]:
    """What the job's process finds in its environment."""
    return dict(os.environ)


@registry.job(name="sample.swap_own_run", max_attempts=1)
def swap_own_run(victim: str) -> str:
    """A hostile job: it puts a link to `victim` in the place of its own run folder (moving the
    folder aside), so that whatever the manager writes for this run would land in `victim`."""
    run = os.environ["FORKVISOR_ATTEMPT_DIR"]
    os.rename(run, f"{run}.moved")
    os.symlink(victim, run)
    return "swapped"


@registry.job(name="sample.fork_on_release")
def fork_on_release(ready: str, release: str, forked: str) -> NoReturn:
    """Announce, wait for `release`, then fork one blocking grandchild (its pid goes to `forked`) and block.
    A retry only blocks: the grandchild was the first run's."""
    announce(ready)
    wait_for_file(release)
    if os.path.exists(forked):
        block_forever()
    pid = os.fork()
    if pid == 0:
        try:
            block_forever()
        finally:
            os._exit(0)
    announce(forked, str(pid))
    block_forever()


@registry.job(name="sample.log_run")
def log_run(path: str) -> int:
    """Append this run's pid to `path`; return how many runs it holds."""
    with open(path, "a") as log:
        log.write(f"{os.getpid()}\n")
    return len(Path(path).read_text().splitlines())


@registry.job(name="sample.block_once")
def block_once(marker: str) -> str:
    """Block on the first run (announcing in `marker`); succeed on any later run."""
    if os.path.exists(marker):
        return "second run"
    announce(marker)
    block_forever()


@registry.job(name="sample.grandchildren")
def grandchildren(
    pids: str, grandchildren_ignore_term: bool = False, child_ignores_term: bool = False, leave_group: bool = True
) -> NoReturn:
    """Fork two grandchildren that leave the process group (setsid, unless not
    `leave_group`) and block; write their pids to `pids` once both are set up; then block."""
    if child_ignores_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    read_end, write_end = os.pipe()
    found = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            try:
                if leave_group:
                    os.setsid()
                signal.signal(signal.SIGTERM, signal.SIG_IGN if grandchildren_ignore_term else signal.SIG_DFL)
                os.write(write_end, b"!")
                block_forever()
            finally:
                os._exit(0)
        found.append(pid)
    set_up = b""
    while len(set_up) < 2:
        set_up += os.read(read_end, 2)
    announce(pids, " ".join(map(str, found)))
    block_forever()


@registry.job(name="sample.hog")
def hog(ready: str, megabytes: int) -> NoReturn:
    data = b"\x01" * (megabytes << 20)  # every page written, so all of it is resident
    announce(ready, str(len(data)))
    block_forever()


@registry.job(name="sample.count_live")
def count_live(live: str, release: str) -> int:
    """Concurrency probe: mark this child live in the folder `live`, note how many
    are live now, wait for `release/PID`, then unmark and return the count seen."""
    pid = str(os.getpid())
    Path(live, pid).touch()
    seen = len(os.listdir(live))
    wait_for_file(Path(release, pid))
    os.unlink(Path(live, pid))
    return seen


@registry.job(name="sample.who_am_i")
def who_am_i() -> dict[str, Any]:
    """What `jobs.current()` says inside the job."""
    found = current()
    return {
        "job_id": found.job_id,
        "attempt": found.attempt,
        "function": found.function,
        "queue": str(found.queue_path),
        "run": str(found.run_path),
    }


@registry.job(name="sample.progress_then_wait")
def progress_then_wait(ready: str, release: str, total: int = 10) -> int:
    """Say 3 of `total` done, announce, wait for `release`, then count to the end in a
    tight loop (every call but the last is rate-limited away)."""
    found = current()
    found.progress(3, total, "three done")
    announce(ready)
    wait_for_file(release)
    for done in range(3, total + 1):
        found.progress(done, total, "counting")
    return total


@registry.job(name="sample.follow_up")
def follow_up(value: Any) -> str:
    """Enqueue a `sample.ok` job into this job's own queue; return its id."""
    return current().queue.enqueue(ok, value)


next_release = Registry()
"""The registry of a newer deploy: it knows a function the one above does not
(`--app tests.sample_jobs:next_release`), for the tests of rolling deploys."""


@next_release.job(name="sample.added_later", max_attempts=4)
def added_later(value: Any = None) -> dict[str, Any]:
    return {"value": value, "manager": os.getppid()}


@registry.job(name="sample.tree")
def tree(kind: str, mark: str, log: str, then: str = "block") -> None:
    """Start a tree of processes (tests/tree_job.py) from Python; block (or end) on the first run."""
    from tests import tree_job

    tree_job.run(kind, mark, log, then)
