"""The references forkvisor is measured against, run in the benchmark's own process.

- `bare_fork`: fork a child per job that exits at once, keeping up to `cap` running;
  `bare_fork_small_process` does the same from a fresh, small interpreter, to
  show what the forking process's size costs.
- `MinimalQueue`: the least work any fork-per-job directory queue can do. Per
  job: rename ready/ID to claimed/ID, fork, the child writes a small result
  file in the job folder and exits, wait, rename claimed/ID to done/ID. Its
  durable form also fsyncs the result file, and both parent folders after
  each rename.
- `RecordingQueue`: the minimal queue plus the records forkvisor keeps of each job
  (counter, run folder, events, outcome, output files, pid, title, process group,
  parent-death signal), as straight-line code: the floor of what forkvisor does.
- `minimal_submit` / `minimal_submit_many`: the submission recipe of
  docs/FORMAT.md (mkdir tmp/ID, write job.json, rename into ready/), with the
  same fsyncs as a durable enqueue, or one syncfs barrier for a batch.
- `minimal_server`: an idle minimal queue woken by inotify, for latency.

The forking references (but the small-process one) run in the same process as
the manager they are compared with, so fork pays for the same resident memory.
"""

from __future__ import annotations

import ctypes
import inspect
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from setproctitle import setproctitle

from benchmarks.common import sync_filesystem
from jobs import new_job_id
from supervisor.watch import Watch

RESULT = b"null\n"
SPEC = b'{"function": "bench.noop", "args": [], "kwargs": {}}\n'


def open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


# -- forking -----------------------------------------------------------------------


def bare_fork(jobs: int, cap: int) -> None:
    """Fork `jobs` children that exit at once, at most `cap` alive at a time."""
    running: set[int] = set()
    started = 0
    while started < jobs or running:
        while started < jobs and len(running) < cap:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            running.add(pid)
            started += 1
        pid, _ = os.waitpid(-1, 0)
        running.discard(pid)


# `bare_fork` itself (its source), timed in a fresh interpreter that imports nothing else.
SMALL_PROCESS_FORK = f"""
import os, resource, sys, time
{inspect.getsource(bare_fork)}
def cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
cpu0, children0, start = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.perf_counter()
bare_fork(int(sys.argv[1]), int(sys.argv[2]))
print(time.perf_counter() - start, cpu(resource.RUSAGE_SELF) - cpu0, cpu(resource.RUSAGE_CHILDREN) - children0)
"""


def bare_fork_small_process(jobs: int, cap: int) -> tuple[float, float, float]:
    """`bare_fork` from a fresh `python -I -S` (about 10 MiB resident instead of this
    process's 20): (wall, its own CPU, its children's CPU) in seconds."""
    command = [sys.executable, "-I", "-S", "-c", SMALL_PROCESS_FORK, str(jobs), str(cap)]
    wall, cpu, children = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split()
    return float(wall), float(cpu), float(children)


class MinimalQueue:
    """ready/, claimed/ and done/ of a bare directory queue."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ready, self.claimed, self.done = (path / name for name in ("ready", "claimed", "done"))
        for folder in (self.ready, self.claimed, self.done):
            folder.mkdir(parents=True, exist_ok=True)

    def fill(self, jobs: int) -> None:
        """Publish `jobs` job folders into ready/ (each with a job.json); untimed."""
        for _ in range(jobs):
            folder = self.ready / new_job_id()
            folder.mkdir(mode=0o700)
            (folder / "job.json").write_bytes(SPEC)

    def run(self, cap: int, durable: bool) -> int:
        """Run every ready job, at most `cap` children at a time; return how many ran."""
        fds = [open_dir(folder) for folder in (self.ready, self.claimed, self.done)]
        try:
            return self._run(cap, durable, *fds)
        finally:
            for fd in fds:
                os.close(fd)

    def _run(self, cap: int, durable: bool, ready_fd: int, claimed_fd: int, done_fd: int) -> int:
        pending = sorted(os.listdir(self.ready), reverse=True)
        running: dict[int, str] = {}
        finished = 0
        while pending or running:
            while pending and len(running) < cap:
                job_id = pending.pop()
                os.rename(self.ready / job_id, self.claimed / job_id)
                if durable:
                    os.fsync(ready_fd)
                    os.fsync(claimed_fd)
                running[self._fork(self.claimed / job_id / "result.json", durable)] = job_id
            pid, _ = os.waitpid(-1, 0)
            job_id = running.pop(pid)
            os.rename(self.claimed / job_id, self.done / job_id)
            if durable:
                os.fsync(claimed_fd)
                os.fsync(done_fd)
            finished += 1
        return finished

    @staticmethod
    def _fork(result: Path, durable: bool) -> int:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                _write(result, RESULT, durable)
                code = 0
            finally:
                os._exit(code)
        return pid


class RecordingQueue(MinimalQueue):
    """The minimal queue plus every record forkvisor keeps of a job, as straight-line code:
    what its guarantees and `forkvisor status` cost before any structure. Beyond the
    minimal queue, per job: `job.json` read; the attempt counter written before the fork
    (a dot-file renamed over it; durable: the file and the folder fsynced); the run's folder;
    an `events` line at the claim and at the end. In the child: its own process group, the
    parent-death signal and the check of its parent, a title, stdout and stderr opened in
    the run's folder, a `pid` file, the FORKVISOR_* variables. After `wait4`: `outcome.json`
    (exit status and rusage; durable: fsynced, and its folder), `result.json` linked into
    the job's folder. The claim's rename is not fsynced, as forkvisor's is not."""

    def _run(self, cap: int, durable: bool, ready_fd: int, claimed_fd: int, done_fd: int) -> int:
        pending = sorted(os.listdir(self.ready), reverse=True)
        ready, claimed, done = str(self.ready), str(self.claimed), str(self.done)
        running: dict[int, str] = {}
        finished = 0
        while pending or running:
            while pending and len(running) < cap:
                job_id = pending.pop()
                job = f"{claimed}/{job_id}"
                os.rename(f"{ready}/{job_id}", job)
                with open(f"{job}/job.json", "rb") as spec_file:
                    function = json.loads(spec_file.read())["function"]
                _replace(job, "attempts", b"1\n", durable)
                os.mkdir(f"{job}/attempt-1", 0o700)
                _append(f"{job}/events", f"{time.time()} claimed: attempt 1/3 (run 1)\n")
                running[_fork_recording(job, job_id, function, durable)] = job_id
            pid, status, usage = os.wait4(-1, 0)
            job_id = running.pop(pid)
            job = f"{claimed}/{job_id}"
            outcome = {"exit_code": os.waitstatus_to_exitcode(status), "pid": pid, "user_s": usage.ru_utime}
            outcome |= {"system_s": usage.ru_stime, "max_rss_kb": usage.ru_maxrss, "ended": time.time()}
            _replace(f"{job}/attempt-1", "outcome.json", json.dumps(outcome, indent=1).encode(), durable)
            os.link(f"{job}/attempt-1/result.json", f"{job}/result.json")
            _append(f"{job}/events", f"{time.time()} done: attempt 1 (run 1) succeeded\n")
            os.rename(job, f"{done}/{job_id}")
            if durable:
                os.fsync(claimed_fd)
                os.fsync(done_fd)
            finished += 1
        return finished


_libc = ctypes.CDLL(None, use_errno=True)
_OUTPUT = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def _fork_recording(job: str, job_id: str, function: str, durable: bool) -> int:
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setpgrp()
            _libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:
                os._exit(71)
            setproctitle(f"job {job_id} {function} attempt 1/3")
            run = f"{job}/attempt-1"
            for target, name in ((1, "stdout"), (2, "stderr")):
                fd = os.open(f"{run}/{name}", _OUTPUT, 0o600)
                os.dup2(fd, target)
                os.close(fd)
            _write(f"{run}/pid", f"{os.getpid()}\n".encode(), False)
            for name, value in (("QUEUE", job), ("JOB_ID", job_id), ("ATTEMPT", "1"), ("ATTEMPT_DIR", run)):
                os.environ[f"FORKVISOR_{name}"] = value
            os.environ["FORKVISOR_FUNCTION"] = function
            _write(f"{run}/result.json", RESULT, durable)
            code = 0
        finally:
            os._exit(code)
    return pid


def _write(path: str | Path, data: bytes, durable: bool) -> None:
    """Create `path` with `data` (fsynced when durable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _replace(folder: str, name: str, data: bytes, durable: bool) -> None:
    _write(f"{folder}/.{name}.tmp", data, durable)
    os.rename(f"{folder}/.{name}.tmp", f"{folder}/{name}")
    if durable:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)


def _append(path: str, line: str) -> None:
    fd = os.open(path, _OUTPUT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- submitting -------------------------------------------------------------------------


def _stage(queue: Path, spec: bytes, durable: bool) -> str:
    job_id = new_job_id()
    staging = queue / "tmp" / job_id
    os.mkdir(staging, 0o700)
    _write(staging / "job.json", spec, durable)
    if durable:
        folder = open_dir(staging)
        os.fsync(folder)
        os.close(folder)
    return job_id


def minimal_submit(queue: Path, durable: bool, spec: bytes = SPEC) -> str:
    """docs/FORMAT.md's recipe for one job: stage in tmp/, rename into ready/, fsync."""
    job_id = _stage(queue, spec, durable)
    os.rename(queue / "tmp" / job_id, queue / "ready" / f"100.{job_id}")
    if durable:
        ready = open_dir(queue / "ready")
        os.fsync(ready)
        os.close(ready)
    return job_id


def minimal_submit_many(queue: Path, count: int, durable: bool) -> list[str]:
    """A batch: stage every job, one syncfs barrier, rename them all, fsync ready/."""
    ids = [_stage(queue, SPEC, False) for _ in range(count)]
    if durable:
        sync_filesystem(queue)
    for job_id in ids:
        os.rename(queue / "tmp" / job_id, queue / "ready" / f"100.{job_id}")
    if durable:
        ready = open_dir(queue / "ready")
        os.fsync(ready)
        os.close(ready)
    return ids


# -- an idle server, for latency ---------------------------------------------------------


def minimal_server(queue: Path, durable: bool) -> None:
    """Serve `queue` (tmp/ ready/ claimed/ done/) one job at a time until killed.

    Woken by inotify on ready/; each job's child writes its start time
    (CLOCK_MONOTONIC) as its result."""
    minimal = MinimalQueue(queue)
    watch = Watch([minimal.ready])
    fds = [open_dir(folder) for folder in (minimal.ready, minimal.claimed, minimal.done)]
    while True:
        select.select([watch.fd], [], [])
        for _, name in watch.read():
            _serve_one(minimal, name, durable, *fds)


def _serve_one(minimal: MinimalQueue, name: str, durable: bool, ready_fd: int, claimed_fd: int, done_fd: int) -> None:
    job_id = name.split(".", 1)[-1]
    claimed = minimal.claimed / job_id
    os.rename(minimal.ready / name, claimed)
    if durable:
        os.fsync(ready_fd)
        os.fsync(claimed_fd)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            started = time.clock_gettime(time.CLOCK_MONOTONIC)
            fd = os.open(claimed / "result.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, f"{started!r}\n".encode())
            if durable:
                os.fsync(fd)
            os.close(fd)
            code = 0
        finally:
            os._exit(code)
    os.waitpid(pid, 0)
    os.rename(claimed, minimal.done / job_id)
    if durable:
        os.fsync(claimed_fd)
        os.fsync(done_fd)
