"""Fixtures for the fault tests: a small tmpfs to fill or make read-only, a way to
run a process as `nobody` (root bypasses permission bits), a fake clock for a
whole process (libfaketime), targets outside the queue that must stay untouched,
and CPU measurements that tell an idle manager from a spinning one.

Everything that needs privileges or a tool the machine may lack (mount,
setpriv, faketime) probes for it first and skips with the reason.
"""

from __future__ import annotations

import errno
import functools
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
import pytest

from jobs import Queue, Registry
from supervisor import Manager
from tests.faults import fault_jobs
from tests.processes import FAST, REPO, Processes, is_gone, wait_until

DAY = 86400.0
GOOD = {"function": "fault.ok", "args": ["good"]}
FILL_CHUNK = 64 * 1024


# -- a small tmpfs ------------------------------------------------------------------------


@dataclass
class Tmpfs:
    """A tmpfs mounted for one test (1 MiB unless asked), filled or remounted at will."""

    path: Path

    def fill(self, name: str = "filler") -> Path:
        """Write a file until the file system is full; return it (unlink it to free the space)."""
        filler = self.path / name
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for chunk in (FILL_CHUNK, 4096, 1):  # down to the last byte of the last page
                try:
                    while True:
                        os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
        finally:
            os.close(fd)
        return filler

    def ballast(self, size: int, name: str = "ballast") -> Path:
        """A file holding `size` bytes of real pages, to delete later to free that much."""
        path = self.path / name
        path.write_bytes(b"\1" * size)
        return path

    def remount(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.path)], check=True, capture_output=True)


def _mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs at `path`; return why it failed, or None."""
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return None if done.returncode == 0 else (done.stderr.strip() or f"mount exited {done.returncode}")


def _unmount(path: Path) -> None:
    """Unmount, lazily if something still holds it (a killed process's open file)."""
    subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True)
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def mounted_tmpfs(where: Path, size: str = "1m") -> Iterator[Tmpfs]:
    where.mkdir(parents=True, exist_ok=True)
    why = _mount_tmpfs(where, size)
    if why is not None:
        pytest.skip(f"cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): {why}")
    try:
        yield Tmpfs(where)
    finally:
        _unmount(where)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    """A 1 MiB tmpfs of this test's own, unmounted (lazily if busy) at teardown."""
    with mounted_tmpfs(tmp_path / "tmpfs") as mounted:
        yield mounted


# -- another user --------------------------------------------------------------------------

NOBODY_PREFIX = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


@functools.cache
def _why_no_nobody() -> str | None:
    """Why this machine cannot run forkvisor as `nobody` (None when it can)."""
    if os.geteuid() != 0:
        return "needs root to switch to nobody"
    if shutil.which("setpriv") is None:
        return "needs setpriv (util-linux) to drop privileges"
    probe = [
        *NOBODY_PREFIX,
        sys.executable,
        "-c",
        "import jobs, supervisor, tests.sample_jobs, tests.faults.fault_jobs",
    ]
    done = subprocess.run(probe, cwd=REPO, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"nobody cannot run this Python or read the repository: {done.stderr.strip()[-300:]}"
    return None


@pytest.fixture
def nobody() -> list[str]:
    """A command prefix that runs the rest as nobody:nogroup, without root's bypass of permissions."""
    why = _why_no_nobody()
    if why is not None:
        pytest.skip(why)
    return NOBODY_PREFIX


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A fresh folder that `nobody` can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="forkvisor-faults-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for root, dirs, _ in os.walk(folder):  # a test may have left folders at mode 000
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o700, follow_symlinks=False)
        shutil.rmtree(folder, ignore_errors=True)


def give_to_nobody(path: Path) -> None:
    """Hand a queue to nobody:nogroup, as if nobody had created it."""
    subprocess.run(["chown", "-R", "nobody:nogroup", str(path)], check=True)


# -- a fake clock ----------------------------------------------------------------------------

# libfaketime (Debian package `faketime`) fakes the clock of a process tree that loads it
# through LD_PRELOAD (rather than through the `faketime` wrapper, which stays the parent
# and would take the signals meant for the manager). The monotonic clock stays faked too
# (FAKETIME_DONT_FAKE_MONOTONIC makes time.sleep fail with EINVAL in 0.9.10). With
# FAKE_UTIME=1, libfaketime 0.9.10 leaves utime(NULL) to the kernel, so touching a file
# stamps the file system's time, as on a host whose clock is off while the file
# server's is right; the probe below checks that this holds rather than trusting it.
LIBFAKETIME = ["/usr/lib/*/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"]


@functools.cache
def _faketime_probe(offset: str) -> tuple[list[str], str | None]:
    """(prefix, None) when libfaketime at `offset` skews the clock but not file times."""
    found = sorted(path for pattern in LIBFAKETIME for path in glob.glob(pattern))
    if not found:
        return [], "needs libfaketime (Debian package `faketime`) to run a manager with a skewed clock"
    prefix = ["env", f"LD_PRELOAD={found[0]}", f"FAKETIME={offset}", "FAKE_UTIME=1"]
    with tempfile.TemporaryDirectory(prefix="forkvisor-faketime-") as folder:
        probe = Path(folder) / "touched"
        probe.touch()
        script = f"import os, time; os.utime({str(probe)!r}); print(time.time())"
        done = subprocess.run([*prefix, sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return [], f"libfaketime does not run Python here: {done.stderr.strip()[-300:]}"
        skew = float(done.stdout) - time.time()
        touched = probe.stat().st_mtime - time.time()
    if abs(skew) < DAY / 2:
        return [], f"libfaketime at {offset} did not skew the clock (skew {skew:.0f}s)"
    if abs(touched) > 60:
        return [], f"under libfaketime, touching a file stamps the fake time too (off by {touched:.0f}s)"
    return prefix, None


def faketime(offset: str) -> list[str]:
    """A command prefix that runs the rest with its clock moved by `offset` (e.g. "+1d")."""
    prefix, why = _faketime_probe(offset)
    if why is not None:
        pytest.skip(why)
    return prefix


# -- processes --------------------------------------------------------------------------------


def start_manager(procs: Processes, queue: Queue, registry: Registry = fault_jobs.registry, **settings: Any) -> Manager:
    """A started manager in this process on `queue` with FAST settings (teardown closes it)."""
    manager = Manager(queue, registry, **{**FAST, **settings})
    procs.managers.append(manager)
    manager.start()
    return manager


def cpu_seconds(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        pytest.fail(f"pid {pid} exited while its CPU time was measured")
    return times.user + times.system


def _sweepers(manager_pid: int) -> list[int]:
    found = []
    for child in psutil.Process(manager_pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "forkvisor: sweeper" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue  # a job's child that ended as we looked
    return found


def sweeper_of(manager_pid: int) -> int:
    """The pid of a manager subprocess's sweeper child (waiting for it to be forked)."""
    wait_until(lambda: len(_sweepers(manager_pid)) == 1, 10, f"manager {manager_pid} had one sweeper")
    return _sweepers(manager_pid)[0]


@contextmanager
def cli_manager(
    procs: Processes, queue: Queue, *options: str, prefix: Sequence[str] = (), grace: float = 10.0
) -> Iterator[subprocess.Popen[bytes]]:
    """`forkvisor run` (fast settings) behind `prefix`, stopped when the block ends whatever
    happened in it (SIGTERM, then SIGKILL after `grace`), so a failing test leaves no process."""
    process = procs.run_manager(queue, *options, prefix=prefix)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def observe(seconds: float, alive: Callable[[], bool], what: str) -> None:
    """Watch for `seconds` (the window of a CPU measurement); fail as soon as `alive()` is false."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive():
            pytest.fail(f"{what} ended during the observation window")
        time.sleep(0.05)  # the observation window itself, not a synchronisation


def idle_cpu(pids: list[int], seconds: float, what: str) -> float:
    """CPU seconds processes `pids` used over `seconds` of wall time (failing if one exits meanwhile)."""
    before = sum(map(cpu_seconds, pids))
    observe(seconds, lambda: not any(map(is_gone, pids)), what)
    return sum(map(cpu_seconds, pids)) - before


def step_cpu(manager: Manager, seconds: float) -> float:
    """Drive an in-process manager for `seconds` of wall time as its own loop would;
    return the CPU time this process used meanwhile."""
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        manager.step(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
    return time.process_time() - cpu


# -- the outside world ----------------------------------------------------------------------------


@contextmanager
def watchdog(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError in this process if the block runs longer than `seconds`
    (a blocking open of a fifo is interrupted by the signal)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"{what} blocked for over {seconds:g}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Outside:
    """Things outside the queue that hostile entries point at: a secret file, a folder
    holding a well-formed job (following a link to it would run it), a fifo.

    Access times are set a day before modification times, so with `relatime` any
    read or listing moves an atime; `check()` also compares modes, ctimes and
    mtimes (a write, a chmod, a new or moved entry) and the contents. A fifo is
    never opened here: tests prove through `watchdog` that nothing blocks on it.
    """

    SECRET = b"root:x:0:0:do not read me\n"
    JOB = b'{"function": "fault.ok", "args": ["from outside the queue"]}'

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir()
        self.secret = folder / "secret"
        self.secret.write_bytes(self.SECRET)
        self.jobs = folder / "jobs"
        self.jobs.mkdir()
        (self.jobs / "job.json").write_bytes(self.JOB)
        self.fifo = folder / "fifo"
        os.mkfifo(self.fifo)
        self._arm()

    def _paths(self) -> list[Path]:
        return [self.folder, self.secret, self.jobs, self.jobs / "job.json", self.fifo]

    def _arm(self) -> None:
        """Put every atime a day behind its mtime, then remember the metadata (never listing
        or reading anything, which would move an atime)."""
        for path in self._paths():
            status = path.lstat()
            os.utime(path, ns=(status.st_mtime_ns - int(DAY * 1e9), status.st_mtime_ns), follow_symlinks=False)
        self._before = self._metadata()

    def _metadata(self) -> dict[str, tuple[int, int, int, int, int]]:
        found = {}
        for path in self._paths():
            status = path.lstat()
            found[str(path)] = (
                status.st_mode,
                status.st_atime_ns,
                status.st_mtime_ns,
                status.st_ctime_ns,
                status.st_size,
            )
        return found

    def check(self) -> None:
        """Fail if anything outside the queue was read, listed, written, moved or created."""
        assert self._metadata() == self._before, "something outside the queue was read, listed, moved or written"
        assert self.secret.read_bytes() == self.SECRET
        assert (self.jobs / "job.json").read_bytes() == self.JOB
        assert sorted(os.listdir(self.folder)) == ["fifo", "jobs", "secret"]
        assert os.listdir(self.jobs) == ["job.json"]
        self._arm()  # the reads above moved atimes: set them back for the next check


def entry_path(parent: Path, name: str | bytes) -> Path:
    """`parent/name` for any name a file system allows, bytes that are not UTF-8 included."""
    return Path(os.fsdecode(os.path.join(os.fsencode(parent), os.fsencode(name))))


def plant_entry(path: Path, kind: str, outside: Outside) -> None:
    """Put something hostile at `path`: a link out of the queue, a fifo, a file or a folder."""
    if kind == "link-secret":
        path.symlink_to(outside.secret)
    elif kind == "link-job":
        path.symlink_to(outside.jobs, target_is_directory=True)
    elif kind == "link-fifo":
        path.symlink_to(outside.fifo)
    elif kind == "dangling":
        path.symlink_to(outside.folder / "nothing-here")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "file":
        path.write_text(json.dumps(GOOD))
    elif kind == "folder":
        path.mkdir()
        (path / "job.json").write_text(json.dumps(GOOD))
    else:
        raise ValueError(kind)


@pytest.fixture
def outside(tmp_path: Path) -> Outside:
    return Outside(tmp_path / "outside")
