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
  With `RunCgroups`, each run also gets its cgroup as forkvisor's manager makes them on
  this host: the least that containing a job's every process costs.
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
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from setproctitle import setproctitle

from benchmarks.common import sync_filesystem
from jobs import new_job_id
from supervisor import containment, forking
from supervisor.watch import Watch

try:
    from supervisor._vfork import fork_into
except ImportError:  # built without a C compiler: no run is born in its cgroup (`RunCgroups.born` is False)
    fork_into = None

RESULT = b"null\n"
# A run's `policy.json` as forkvisor's claim writes it (the defaults, and where each came from).
POLICY = json.dumps(
    {
        "max_attempts": 3,
        "timeout": None,
        "memory_limit": None,
        "output_limit": 8 << 20,
        "backoff": "exponential 1s 5m",
        "sources": dict.fromkeys(("max_attempts", "timeout", "memory_limit", "output_limit", "backoff"), "default"),
    },
    indent=1,
).encode()
SPEC = b'{"function": "bench.noop", "args": [], "kwargs": {}}\n'
TRUE = shutil.which("true") or "/bin/true"


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


class RunCgroups:
    """A cgroup per run, as forkvisor's manager makes them on this host (`containment.detect`):
    the least that containing every process of a job costs, which is standing rule 2 of the
    project. Per run: its v2 cgroup made and its first process born in it (clone3, where the
    host allows, as the manager's probe says; else the child moves in); on a hybrid host its
    v1 memory cgroup made too, and entered by the child; after the run, its CPU, memory peak
    and OOM kills read, and both removed. `here()` gives None where forkvisor's runs get none."""

    def __init__(self, found: containment.CgroupContainment) -> None:
        self.owner = f"reference.{os.getpid()}"
        found.open_owner(self.owner)  # (also probes whether a child may be born in its cgroup)
        self.runs = os.path.join(found.base, self.owner)
        memory = found.memory
        self.files = None if memory is None else memory.files
        self.memory = None if memory is None or memory.files.own_cgroup else os.path.join(memory.base, self.owner)
        self.born = bool(found.forks_into)

    @classmethod
    @contextmanager
    def here(cls) -> Iterator[RunCgroups | None]:
        """Runs' cgroups as forkvisor's manager makes them here (None where it makes none);
        their owner's folder removed after."""
        found = containment.detect()
        cgroups = cls(found) if isinstance(found, containment.CgroupContainment) else None
        try:
            yield cgroups
        finally:
            if cgroups is not None:
                found.close_owner(cgroups.owner)

    def make(self, name: str, forked: bool = True) -> tuple[int, int, int]:
        """Make run `name`'s cgroups; return what its child needs, each -1 where not needed:
        the cgroup's folder to be born in (a `forked` child, where the host allows), its
        `cgroup.procs` and the memory cgroup's to enter."""
        path = f"{self.runs}/{name}"
        os.mkdir(path)
        born = forked and self.born
        folder = os.open(path, _O_DIR) if born else -1
        procs = -1 if born else os.open(f"{path}/cgroup.procs", _O_PROCS)
        memory = -1
        if self.memory is not None:
            os.mkdir(f"{self.memory}/{name}")
            memory = os.open(f"{self.memory}/{name}/cgroup.procs", _O_PROCS)
        return folder, procs, memory

    def end(self, name: str) -> dict[str, Any]:
        """After run `name`: what it used, as its cgroups counted; then remove them."""
        path = f"{self.runs}/{name}"
        memory = path if self.memory is None else f"{self.memory}/{name}"
        usage = _keyed(f"{path}/cpu.stat")
        cost: dict[str, Any] = {"cpu_user": usage[b"user_usec"] / 1e6, "cpu_system": usage[b"system_usec"] / 1e6}
        if self.files is not None:
            cost["peak_memory"] = int(_read(f"{memory}/{self.files.peak}"))
            cost["oom_kills"] = _keyed(f"{memory}/{self.files.oom}").get(b"oom_kill", 0)
        os.rmdir(path)
        if self.memory is not None:
            os.rmdir(memory)
        return cost


_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_O_PROCS = os.O_WRONLY | os.O_CLOEXEC


def _keyed(path: str) -> dict[bytes, int]:
    return {name: int(value) for name, value in (line.split(b" ") for line in _read(path).splitlines())}


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


class RecordingQueue(MinimalQueue):
    """The minimal queue plus every record forkvisor keeps of a job, as straight-line code,
    with the barriers of issue 30's decisions: what its guarantees and `forkvisor status`
    cost before any structure. Beyond the minimal queue, per job: `job.json` read; the
    attempt counter (a dot-file renamed over it); the run's folder and its `policy.json`; an
    `events` line at the claim and at the end. In the child: its own process group, the
    parent-death signal and the check of its parent, a title, stdout and stderr opened in the
    run's folder, a `pid` file, the FORKVISOR_* variables. After `wait4`: `outcome.json`
    (exit status and rusage), `result.json` linked into the job's folder, the move to done/.

    Durable, the decisions' best: each child is forked before its count is on disk and waits
    at a gate (a pipe) until it is; the counts of one turn's claims share their barriers (every
    staged file synced, then every rename made and every job folder synced), and so do the ends
    of one turn's exited children (every outcome file, then the renames, the run and job folders,
    then the moves and one fsync of claimed/ and of done/). Every file and folder a step changes
    is synced before the step that relies on it, as the crash-state tests ask of forkvisor; on a
    journaling file system the first fsync of a step commits the whole step. The claim's rename
    is not synced, as forkvisor's is not. Its ratio to the minimal queue is the most any code
    keeping forkvisor's records under those decisions can reach."""

    RESULT_LINKED = True
    stamps = False  # each child's result: its start time (CLOCK_MONOTONIC), for latency; else `null`

    def __init__(self, path: Path, cgroups: RunCgroups | None = None) -> None:
        super().__init__(path)
        self.cgroups = cgroups  # a cgroup per run (`RunCgroups`), or none

    def _run(self, cap: int, durable: bool, ready_fd: int, claimed_fd: int, done_fd: int) -> int:
        pending = sorted(os.listdir(self.ready), reverse=True)
        running: dict[int, str] = {}
        finished = 0
        while pending or running:
            claimed = [pending.pop() for _ in range(min(len(pending), cap - len(running)))]
            if claimed:
                running |= self._start_turn(claimed, durable)
            ended = [os.wait4(-1, 0)]
            while running and len(ended) < len(running) and (more := os.wait4(-1, os.WNOHANG))[0]:
                ended.append(more)
            self._end_turn([(running.pop(pid), pid, status, usage) for pid, status, usage in ended], durable)
            if durable:
                os.fsync(claimed_fd)
                os.fsync(done_fd)
            finished += len(ended)
        return finished

    def _start_turn(self, entries: list[str], durable: bool) -> dict[int, str]:
        """Claim, count and fork each job; durable, open their gates after the counts' shared barriers."""
        claimed = [self._claim(entry) for entry in entries]
        folders = [f"{self.claimed}/{job_id}" for job_id, _ in claimed]
        if not durable:
            _commit_counts(folders, durable)
        started, openers = {}, []
        for (job_id, function), folder in zip(claimed, folders, strict=True):
            gate, opener = os.pipe() if durable else (-1, -1)
            cgroup = NO_CGROUP if self.cgroups is None else self.cgroups.make(job_id)
            started[_fork_recording(folder, job_id, function, durable, gate, self.stamps, cgroup)] = job_id
            for fd in cgroup:
                if fd >= 0:
                    os.close(fd)
            if durable:
                os.close(gate)
                openers.append(opener)
        if durable:
            _commit_counts(folders, durable)
        for opener in openers:
            os.write(opener, b"x")
            os.close(opener)
        return started

    def _claim(self, entry: str) -> tuple[str, str]:
        """Take the job at `ready/entry` (`ID`, or `PRIORITY.ID` as submitted), read its function,
        stage its count, make its run folder with its policy, log the claim; its id and function."""
        job_id = entry.partition(".")[2] or entry
        job = f"{self.claimed}/{job_id}"
        os.rename(f"{self.ready}/{entry}", job)
        with open(f"{job}/job.json", "rb") as spec_file:
            function = json.loads(spec_file.read())["function"]
        _write(f"{job}/.attempts.tmp", b"1\n", False)
        os.mkdir(f"{job}/attempt-1", 0o700)
        _write(f"{job}/attempt-1/policy.json", POLICY, False)  # (not synced, as forkvisor's is not)
        _append(f"{job}/events", f"{time.time()} claimed: attempt 1/3 (run 1)\n")
        return job_id, function

    def serve(self, entry: str, durable: bool, claimed_fd: int, done_fd: int) -> None:
        """An idle server's turn: run the job at `ready/entry` alone, to its end in done/."""
        started = self._start_turn([entry], durable)
        pid, status, usage = os.wait4(next(iter(started)), 0)
        self._end_turn([(started[pid], pid, status, usage)], durable)
        if durable:
            os.fsync(claimed_fd)
            os.fsync(done_fd)

    def _end_turn(self, ended: list[tuple[str, int, int, Any]], durable: bool) -> None:
        """Record the outcomes of one turn's exited children, their barriers shared, then move them to done/."""
        jobs = []
        for job_id, pid, status, usage in ended:
            job = f"{self.claimed}/{job_id}"
            outcome = {"exit_code": os.waitstatus_to_exitcode(status), "pid": pid, "user_s": usage.ru_utime}
            outcome |= {"system_s": usage.ru_stime, "max_rss_kb": usage.ru_maxrss, "ended": time.time()}
            if self.cgroups is not None:
                outcome["cost"] = self.cgroups.end(job_id)
            _write(f"{job}/attempt-1/.outcome.json.tmp", json.dumps(outcome, indent=1).encode(), False)
            jobs.append((job_id, job))
        if durable:
            _sync_each([f"{job}/attempt-1/.outcome.json.tmp" for _, job in jobs])
        for _, job in jobs:
            os.rename(f"{job}/attempt-1/.outcome.json.tmp", f"{job}/attempt-1/outcome.json")
            if self.RESULT_LINKED:
                os.link(f"{job}/attempt-1/result.json", f"{job}/result.json")
            _append(f"{job}/events", f"{time.time()} done: attempt 1 (run 1) succeeded\n")
        if durable:
            _sync_each([path for _, job in jobs for path in (f"{job}/attempt-1", job)])
        for job_id, job in jobs:
            os.rename(job, f"{self.done}/{job_id}")


class CommandRecordingQueue(RecordingQueue):
    """The recording queue for command jobs (`true`), started as forkvisor starts them by
    default, from its C module (`forking.vfork_exec`: no copy of this process); the manager
    opens the run's output files and writes its `pid` file. A vforked child cannot wait at a
    gate, so the counts of one turn's claims are on disk, their barriers shared, before any
    of them starts. No result to link: a command's is its exit status, in `outcome.json`.
    With `RunCgroups`, the vforked child enters its run's cgroups before exec, as
    forkvisor's does (see docs/DECISIONS.md on why it is not born in them)."""

    RESULT_LINKED = False

    def _start_turn(self, entries: list[str], durable: bool) -> dict[int, str]:
        claimed = [job_id for job_id, _ in map(self._claim, entries)]
        _commit_counts([f"{self.claimed}/{job_id}" for job_id in claimed], durable)
        started = {}
        for job_id in claimed:
            job = f"{self.claimed}/{job_id}"
            run = f"{job}/attempt-1"
            output = [os.open(f"{run}/{name}", _OUTPUT, 0o600) for name in ("stdout", "stderr")]
            stdin = os.open(os.devnull, os.O_RDONLY)
            variables = {"FORKVISOR_QUEUE": job, "FORKVISOR_JOB_ID": job_id, "FORKVISOR_ATTEMPT_DIR": run}
            _, procs, memory = NO_CGROUP if self.cgroups is None else self.cgroups.make(job_id, forked=False)
            pid = forking.vfork_exec((TRUE,), variables, (stdin, *output), None, (procs, memory))
            for fd in (stdin, *output, procs, memory):
                if fd >= 0:
                    os.close(fd)
            _write(f"{run}/pid", f"{pid}\n".encode(), False)
            started[pid] = job_id
        return started


def _commit_counts(jobs: list[str], durable: bool) -> None:
    """Put the staged counts of `jobs` in place; durable, every staged file synced first and
    every job folder after (the barriers of one turn shared)."""
    if durable:
        _sync_each([f"{job}/.attempts.tmp" for job in jobs])
    for job in jobs:
        os.rename(f"{job}/.attempts.tmp", f"{job}/attempts")
    if durable:
        _sync_each(jobs)


_libc = ctypes.CDLL(None, use_errno=True)
_OUTPUT = os.O_WRONLY | os.O_CREAT | os.O_APPEND


NO_CGROUP = (-1, -1, -1)


def _fork_recording(
    job: str, job_id: str, function: str, durable: bool, gate: int, stamps: bool, cgroup: tuple[int, int, int]
) -> int:
    parent = os.getpid()
    folder, procs, memory = cgroup
    pid = fork_into(folder) if folder >= 0 else os.fork()
    if pid == 0:
        code = 1
        try:
            for entry in (procs, memory):  # into the run's cgroups, where it was not born in them
                if entry >= 0:
                    os.write(entry, b"0")
            for fd in cgroup:  # no process of the job holds them
                if fd >= 0:
                    os.close(fd)
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
            if gate >= 0 and os.read(gate, 1) != b"x":  # the gate: no job code before its count is on disk
                os._exit(72)
            result = f"{time.clock_gettime(time.CLOCK_MONOTONIC)!r}\n".encode() if stamps else RESULT
            _write(f"{run}/result.json", result, durable)
            code = 0
        finally:
            os._exit(code)
    return pid


def _sync_each(paths: list[str]) -> None:
    """fsync every file or folder of `paths` (on a journaling file system the first commits them all)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write(path: str | Path, data: bytes, durable: bool) -> None:
    """Create `path` with `data` (fsynced when durable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def _append(path: str, line: str) -> None:
    fd = os.open(path, _OUTPUT, 0o600)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


# -- submitting -------------------------------------------------------------------------


def _stage(queue: Path, spec: bytes, durable: bool, logged: bool = False) -> str:
    job_id = new_job_id()
    staging = queue / "tmp" / job_id
    os.mkdir(staging, 0o700)
    if logged:  # first, as forkvisor's enqueue does: job.json's fsync commits it too
        _append(f"{staging}/events", f"{time.time()} enqueued\n")
    _write(staging / "job.json", spec, durable)
    if durable:
        folder = open_dir(staging)
        os.fsync(folder)
        os.close(folder)
    return job_id


def minimal_submit(queue: Path, durable: bool, spec: bytes = SPEC, logged: bool = False) -> str:
    """docs/FORMAT.md's recipe for one job: stage in tmp/, rename into ready/, fsync (`logged`:
    with the `events` line forkvisor's enqueue writes)."""
    job_id = _stage(queue, spec, durable, logged)
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


def recording_server(queue: Path, durable: bool) -> None:
    """`minimal_server` with forkvisor's records and barriers (`RecordingQueue.serve`): the
    floor of an idle manager's latency under issue 30's decisions."""
    recording = RecordingQueue(queue)
    recording.stamps = True
    watch = Watch([recording.ready])
    claimed_fd, done_fd = open_dir(recording.claimed), open_dir(recording.done)
    while True:
        select.select([watch.fd], [], [])
        for _, name in watch.read():
            recording.serve(name, durable, claimed_fd, done_fd)


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
