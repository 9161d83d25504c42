"""Fuzzing the store with hostile job folders (hypothesis).

Each example builds a fresh queue whose state folders hold random entries:
job folders with broken, huge, mistyped or non-UTF-8 `job.json`, functions
that are not registered, odd names (dots, control characters, bytes that are
not UTF-8), links out of the queue, fifos, files where folders belong, and
traps inside job folders. Then it reads the queue (counts, list, job), sweeps
it, and claims and finishes everything, as managers and operators do.

Nothing may raise; nothing may block (a watchdog interrupts a blocking open);
every entry that is not a job ends in `quarantine/` with a note, every job in
`done/` or `dead/` with its cause; nothing outside the queue is touched.

A folder where `result.json` or `error.json` belongs is quarantined from
inside its job when the store has to write the file (so it may or may not be,
depending on how the job ends); the check allows for it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs import JobNotFound, Owner, Queue, State, new_job_id, unknown_liveness
from jobs.job import MAX_SPEC_BYTES, ready_name, scheduled_name
from jobs.lease import OWNER_FILE
from tests.faults.conftest import Outside, entry_path, plant_entry, watchdog

FIELDS = ["function", "args", "kwargs", "max_attempts", "timeout", "priority", "memory_limit", "created", "metadata"]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
FUNCTIONS = st.sampled_from(
    ["fault.ok", "os.system", "../x", "fault.ok\n", "", "builtins.eval", "tests.faults.fault_jobs.ok"]
)

SPECS = st.one_of(
    st.builds(lambda fn: {"function": fn, "args": ["fuzz"]}, FUNCTIONS),
    st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), JSON_VALUES, max_size=5),
    st.binary(max_size=40),
    st.just(None),  # no job.json at all
    st.just("huge"),
    st.sampled_from(["link-secret", "link-fifo", "fifo", "folder", "dangling"]),  # job.json is not a file
)

TRAP_KINDS = ["link-secret", "link-job", "link-fifo", "dangling", "fifo", "file", "folder"]
FILE_TRAPS = {
    # where the store writes or reads a file
    "result.json": TRAP_KINDS,
    "error.json": TRAP_KINDS,
    ".result.json.link": TRAP_KINDS,
    "events": TRAP_KINDS,
    "attempts": [*TRAP_KINDS, "1", "junk", "99999999999999999999"],
    "cancel": TRAP_KINDS,
    "attempt-1": TRAP_KINDS,
    "attempt-7": TRAP_KINDS,
}
TRAPS = st.dictionaries(st.sampled_from(sorted(FILE_TRAPS)), st.just(None), max_size=3).flatmap(
    lambda chosen: st.fixed_dictionaries({name: st.sampled_from(FILE_TRAPS[name]) for name in chosen})
)

BAD_NAMES = st.binary(min_size=1, max_size=12).filter(
    lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
)
NOT_A_JOB = st.sampled_from(["link-secret", "link-job", "link-fifo", "dangling", "fifo", "file"])

WHERE = st.sampled_from(["ready", "scheduled", "owner", "tmp", "done", "dead"])


@dataclass(frozen=True)
class Entry:
    """One thing planted in a state folder."""

    where: str
    job: bool  # a well-named job folder (else: a bad name or not a folder)
    spec: Any = None
    traps: dict[str, str] = field(default_factory=dict)
    kind: str = "folder"
    name: bytes = b""


ENTRIES = st.one_of(
    st.builds(Entry, where=WHERE, job=st.just(True), spec=SPECS, traps=TRAPS),
    st.builds(Entry, where=WHERE, job=st.just(False), kind=NOT_A_JOB),
    st.builds(Entry, where=WHERE, job=st.just(False), kind=st.just("folder"), name=BAD_NAMES),
)


@dataclass
class Planted:
    job_ids: set[str] = field(default_factory=set)  # well-named job folders in ready/, scheduled/, claimed/
    not_jobs: int = 0  # entries of ready/, scheduled/, claimed/ and tmp/ that must be quarantined
    terminal: int = 0  # folders planted in done/ and dead/ directly: counted there (by link count), never moved


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh folder per example (pytest's tmp_path is per test, not per example)."""
    folder = Path(tempfile.mkdtemp(prefix="forkvisor-fuzz-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def write_spec(job_dir: Path, spec: Any, outside: Outside) -> None:
    if spec is None:
        return
    if spec == "huge":
        with open(job_dir / "job.json", "wb") as file:
            file.truncate(MAX_SPEC_BYTES + 1)  # sparse: costs no disk
    elif isinstance(spec, str):
        plant_entry(job_dir / "job.json", spec, outside)
    elif isinstance(spec, bytes):
        (job_dir / "job.json").write_bytes(spec)
    else:
        (job_dir / "job.json").write_text(json.dumps(spec))


def plant_trap(path: Path, kind: str, outside: Outside) -> None:
    if kind in TRAP_KINDS:
        plant_entry(path, kind, outside)
    else:
        path.write_text(kind)  # an attempts counter with this text


def plant(queue: Queue, owner_dir: Path, entry: Entry, outside: Outside, planted: Planted) -> None:
    job_id = new_job_id()
    parent = {"owner": owner_dir}.get(entry.where, queue.path / entry.where)
    if entry.job:
        name = {"incoming": 0, "ready": ready_name(job_id, 0), "scheduled": scheduled_name(job_id, 0, 1.0)}.get(
            entry.where, job_id
        )
    else:
        name = os.fsdecode(entry.name) if entry.name else ready_name(job_id, 0)
    path = entry_path(parent, name)
    if os.path.lexists(path):
        return  # hypothesis drew the same odd name twice
    if entry.job and entry.where != "tmp":
        path.mkdir()
        write_spec(path, entry.spec, outside)
        for trap, kind in entry.traps.items():
            plant_trap(path / trap, kind, outside)
        if entry.where in ("done", "dead"):
            planted.terminal += 1
        else:
            planted.job_ids.add(job_id)
        return
    kind = entry.kind if not entry.job else "folder"
    plant_entry(path, kind, outside)
    if entry.where == "tmp":
        os.utime(path, (1, 1), follow_symlinks=False)  # abandoned long ago
    if entry.where not in ("done", "dead"):
        planted.not_jobs += 1
    elif kind == "folder":
        planted.terminal += 1  # counts() reads link counts: a folder in done/ counts, whatever its name


def gone_owner(queue: Queue) -> Path:
    """The folder of an owner on another host, silent since 1970, to be reaped."""
    owner = Owner(name="otherhost.9.abcdef", host="otherhost", pid=9, lease=1.0)
    queue.serving.register_owner(owner)
    folder = queue.path / "claimed" / owner.name
    os.utime(folder / OWNER_FILE, (1, 1))
    return folder


def read_everything(queue: Queue, ids: set[str]) -> None:
    """What an operator's `status`, `list` and `show` do: never raises on a bad entry."""
    queue.counts()
    queue.jobs()
    for job_id in ids:
        try:
            queue.job(job_id)
        except JobNotFound:
            pass  # not every planted id names a job (a link is not one)


def drain(queue: Queue, finish: list[bool]) -> int:
    """Claim everything; complete or fail each claim as the fuzz says; return how many."""
    owner = Owner.new()
    queue.serving.register_owner(owner)
    count = 0
    while (claim := queue.serving.claim(owner.name)) is not None:
        if finish[count % len(finish)]:
            queue.serving.complete(claim)
        else:
            queue.serving.fail(claim, {"message": "fuzz"}, permanent=True)
        count += 1
    queue.serving.retire_owner(owner.name)
    return count


def check_settled(queue: Queue, planted: Planted) -> None:
    for name in ("ready", "scheduled", "tmp"):
        assert os.listdir(queue.path / name) == [], f"{name}/ still holds {os.listdir(queue.path / name)}"
    assert os.listdir(queue.path / "claimed") == [], os.listdir(queue.path / "claimed")
    counts = queue.counts()
    assert counts["done"] + counts["dead"] == len(planted.job_ids) + planted.terminal, counts
    for job_id in planted.job_ids:
        found = queue.job(job_id)
        assert found.state.terminal, found
        if found.state is State.DEAD:
            assert found.error is not None, f"dead job {job_id} has no cause"
            assert found.error.get("reason"), found.error
    names = os.listdir(queue.path / "quarantine")
    entries = [name for name in names if not name.endswith(".why")]
    from_inside_jobs = [name for name in entries if name.split(".")[0] in planted.job_ids]  # folder traps
    assert len(entries) - len(from_inside_jobs) == planted.not_jobs, (entries, planted)
    assert len(names) == 2 * len(entries), "every quarantined entry has its .why note"


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(entries=st.lists(ENTRIES, max_size=12), finish=st.lists(st.booleans(), min_size=1, max_size=4))
def test_store_survives_hostile_job_folders(entries: list[Entry], finish: list[bool]) -> None:
    with scratch() as folder:
        outside = Outside(folder / "outside")
        queue = Queue(folder / "queue", durable=False)
        owner_dir = gone_owner(queue)
        planted = Planted()
        for entry in entries:
            plant(queue, owner_dir, entry, outside, planted)
        with watchdog(10, "a store operation"):
            read_everything(queue, planted.job_ids)
            queue.serving.sweep(queue.serving.filesystem_now() + 3600, unknown_liveness, tmp_age=60)
            drain(queue, finish)
            read_everything(queue, planted.job_ids)
            check_settled(queue, planted)
        outside.check()


def atime_moves(folder: Path) -> bool:
    """Whether reading a file whose atime is older than its mtime moves the atime (relatime does)."""
    probe = folder / "atime-probe"
    probe.write_bytes(b"x")
    mtime = probe.stat().st_mtime_ns
    os.utime(probe, ns=(mtime - 10**12, mtime))
    probe.read_bytes()
    return probe.stat().st_atime_ns >= mtime


@pytest.mark.parametrize("how", ["read", "list", "touch"])
def test_outside_check_sees_anything_done_through_a_link(tmp_path: Path, how: str) -> None:
    """The harness can fail: reading, listing or touching through a planted link shows."""
    if how != "touch" and not atime_moves(tmp_path):
        pytest.skip("this file system does not record reads (noatime): only writes can be seen")
    outside = Outside(tmp_path / "outside")
    (tmp_path / "file").symlink_to(outside.secret)
    (tmp_path / "folder").symlink_to(outside.jobs, target_is_directory=True)
    {
        "read": (tmp_path / "file").read_bytes,
        "list": lambda: os.listdir(tmp_path / "folder"),
        "touch": lambda: os.utime(tmp_path / "file"),
    }[how]()
    with pytest.raises(AssertionError, match="outside the queue"):
        outside.check()


def test_watchdog_interrupts_a_blocking_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="opening a fifo blocked"), watchdog(0.2, "opening a fifo"):
        open(tmp_path / "fifo", "wb").close()  # blocks: no reader
    assert time.monotonic() - started < 5
