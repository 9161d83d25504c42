"""Fixtures for the fast tests of the job store: a queue in `tmp_path`, a registry
of sample functions, a registered owner, and helpers that write the queue's
folders by hand (as another language, an operator, or a crash would leave them).

Nothing here forks or sleeps: time is passed in as `now`, and a file's age is
set with `os.utime`.
"""

from __future__ import annotations

import json
import os
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import jobs.index
from jobs import Owner, Queue, Registry, State, new_job_id
from jobs.job import ready_name, scheduled_name
from jobs.lease import OWNER_FILE

SAMPLES = Registry()


@SAMPLES.job
def add(a: int, b: int) -> int:
    return a + b


@SAMPLES.job(max_attempts=5, timeout=30.0, memory_limit=1 << 30)
def resize(path: str, width: int = 200) -> str:
    return f"{path}@{width}"


@SAMPLES.job(name="sample.echo")
def echo(*args: Any, **kwargs: Any) -> Any:
    return [args, kwargs]


def undecorated(x: int) -> int:
    return x


@pytest.fixture
def registry() -> Registry:
    """The registry of the sample functions."""
    return SAMPLES


@pytest.fixture
def samples() -> types.SimpleNamespace:
    """The sample functions: `add`, `resize` (max_attempts=5, timeout=30), `echo`
    (registered as "sample.echo") and `undecorated` (not registered)."""
    return types.SimpleNamespace(add=add, resize=resize, echo=echo, undecorated=undecorated)


@pytest.fixture
def queue_path(tmp_path: Path) -> Path:
    return tmp_path / "queue"


@pytest.fixture
def queue(queue_path: Path) -> Queue:
    """A fresh, durable queue."""
    return Queue(queue_path, create=True)


@pytest.fixture
def owner(queue: Queue) -> Owner:
    """An owner registered on `queue` (lease 60 s)."""
    found = Owner.new(lease=60.0)
    queue.serving.register_owner(found)
    return found


@pytest.fixture
def frozen_index_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop the ready index's clock, so it rescans `ready/` only when it runs dry.

    The index rescans when its last scan is over 50 ms old; freezing its clock
    makes claim order independent of how fast the test runs.
    """
    monkeypatch.setattr(jobs.index, "time", types.SimpleNamespace(monotonic=lambda: 1000.0))


class Hand:
    """Writes and reads a queue's folders directly, the way docs/FORMAT.md describes them."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.root = queue.path

    def dir(self, state: State | str) -> Path:
        return self.root / (state.value if isinstance(state, State) else state)

    def names(self, state: State | str) -> list[str]:
        """Sorted entry names of a folder of the queue (as str, surrogate-escaped)."""
        return sorted(os.listdir(self.dir(state)))

    def job_dir(
        self,
        parent: Path,
        name: str | bytes,
        spec: dict[str, Any] | bytes | None,
        *,
        attempts: int | None = None,
    ) -> Path:
        """Write a job directory `parent/name` holding `spec` as job.json (None: no job.json)."""
        path = Path(os.fsdecode(os.path.join(os.fsencode(parent), os.fsencode(name))))
        os.mkdir(path, 0o700)
        if spec is not None:
            data = spec if isinstance(spec, bytes) else json.dumps(spec).encode()
            (path / "job.json").write_bytes(data)
        if attempts is not None:
            (path / "attempts").write_text(f"{attempts}\n")
        return path

    def ready_job(self, spec: dict[str, Any] | bytes | None, priority: int = 0) -> tuple[str, Path]:
        """A job published in ready/ by hand; return (id, path)."""
        job_id = new_job_id()
        return job_id, self.job_dir(self.dir(State.READY), ready_name(job_id, priority), spec)

    def scheduled_job(self, spec: dict[str, Any], due: float, priority: int = 0) -> tuple[str, Path]:
        job_id = new_job_id()
        return job_id, self.job_dir(self.dir(State.SCHEDULED), scheduled_name(job_id, priority, due), spec)

    def owner(self, owner: Owner | None = None) -> Owner:
        """Register an owner folder (through the queue) and return the owner."""
        owner = owner or Owner.new()
        self.queue.serving.register_owner(owner)
        return owner

    def heartbeat_of(self, owner: Owner) -> float:
        return os.stat(self.dir(State.CLAIMED) / owner.name / OWNER_FILE).st_mtime

    def expired_now(self, owner: Owner) -> float:
        """A `now` at which `owner`'s lease has just run out."""
        return self.heartbeat_of(owner) + owner.lease + 1

    def quarantined(self) -> dict[str, str]:
        """{quarantined entry name: its .why note}."""
        folder = self.dir("quarantine")
        names = os.listdir(folder)
        entries = [name for name in names if not name.endswith(".why")]
        assert sorted(f"{name}.why" for name in entries) == sorted(n for n in names if n.endswith(".why")), names
        return {name: (folder / f"{name}.why").read_text() for name in entries}

    def error(self, job_id: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads((self.dir(State.DEAD) / job_id / "error.json").read_text())
        return result

    def submission(self, document: dict[str, Any], job_id: str | None = None) -> str:
        """A member's submission written by hand into this user's folder of incoming/ (as
        another language would: its id dated ahead of the file, see `jobs.incoming`)."""
        job_id = job_id or new_job_id(time.time() + 5)
        mine = self.queue.path / "incoming" / str(os.geteuid())
        mine.mkdir(exist_ok=True)
        (mine / f"{job_id}.json").write_text(json.dumps(document))
        return job_id

    def age(self, path: Path, seconds: float, now: float) -> None:
        """Set `path`'s mtime to `seconds` before `now` (without following a symlink)."""
        os.utime(path, (now - seconds, now - seconds), follow_symlinks=False)


@pytest.fixture
def hand(queue: Queue) -> Hand:
    return Hand(queue)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """A folder outside the queue, with job-like content, that must stay untouched.

    Its atimes are set a day before its mtimes, so with `relatime` (or
    `strictatime`) any read or listing of it moves an atime and the final check
    fails; a move or a write changes the names, an mtime or a content.
    """
    folder = tmp_path / "outside"
    folder.mkdir()
    contents = {
        "job.json": json.dumps({"function": "sample.echo", "args": ["outside"]}),
        "attempts": "0\n",
        "secret": "do not read me\n",
    }
    for name, text in contents.items():
        (folder / name).write_text(text)
    paths = [folder, *(folder / name for name in contents)]
    for path in paths:
        mtime = path.stat().st_mtime
        os.utime(path, (mtime - 86400, mtime))
    before = [(path.stat().st_atime, path.stat().st_mtime) for path in paths]
    yield folder
    assert [(path.stat().st_atime, path.stat().st_mtime) for path in paths] == before, (
        "something outside the queue was read, listed or written"
    )
    assert sorted(os.listdir(folder)) == sorted(contents)
    assert {name: (folder / name).read_text() for name in contents} == contents
