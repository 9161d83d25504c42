"""Unique jobs (`jobs.keys`): at most one live job per key, across processes, through
crashes; a key is free again once its job is done or dead."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from jobs import Call, InvalidJob, JobOptions, KeyTaken, Owner, Queue, State, WrongState, new_job_id
from jobs import files as job_files
from tests import sample_jobs
from tests.conftest import wait_until
from tests.jobs.conftest import add
from tests.processes import Processes

KEY = "report:2026-11-23"


def _keyed(queue: Queue, key: str = KEY, **options: object) -> str:
    return queue.with_options(key=key, **options).enqueue(add, 1, 2)


def _run(queue: Queue, job_id: str) -> None:
    """Claim the job and complete it, as a manager would."""
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert claim.job_id == job_id
    queue.serving.complete(claim)


def test_a_live_key_returns_the_job_that_holds_it(queue: Queue) -> None:
    first = _keyed(queue)
    assert _keyed(queue) == first
    assert _keyed(queue, delay=3600) == first  # whatever its options
    other = _keyed(queue, key="report:2026-11-24")
    assert other != first
    assert sorted(job.id for job in queue.jobs(State.READY)) == sorted([first, other])
    assert queue.job(first).spec.key == KEY


def test_a_submitter_may_ask_to_be_told_instead(queue: Queue) -> None:
    first = _keyed(queue)
    with pytest.raises(KeyTaken, match="held by job") as raised:
        _keyed(queue, if_key_taken="raise")
    assert raised.value.job_id == first
    assert isinstance(raised.value, WrongState)
    assert queue.counts()["ready"] == 1
    assert os.listdir(queue.path / "tmp") == []  # the refused job was not left behind


@pytest.mark.parametrize("finish", ["done", "cancelled"])
def test_a_finished_jobs_key_is_free_again(queue: Queue, finish: str) -> None:
    first = _keyed(queue)
    if finish == "done":
        _run(queue, first)
    else:
        queue.cancel(first)
    second = _keyed(queue)
    assert second != first
    assert queue.job(second).state is State.READY
    assert _keyed(queue) == second
    generations = os.listdir(queue.path / "keys" / KEY)
    assert generations == ["0000000002"], generations  # the older one never decides again


def test_keys_become_folder_names_that_say_what_they_are(queue: Queue) -> None:
    _keyed(queue, key="user 42/export")
    _keyed(queue, key=".hidden")
    assert sorted(os.listdir(queue.path / "keys")) == ["%2Ehidden", "user%2042%2Fexport"]
    long_ones = ["日本" * 100, "日本" * 99 + "x"]  # 200 characters, 2,400 once escaped: too long for a name
    first = [_keyed(queue, key=key) for key in long_ones]
    assert [_keyed(queue, key=key) for key in long_ones] == first
    assert first[0] != first[1]
    assert all(len(name) <= 201 for name in os.listdir(queue.path / "keys"))


@pytest.mark.parametrize("key", ["", "x" * 201, "two\nlines", 7])
def test_a_bad_key_is_refused_before_anything_is_written(queue: Queue, key: object) -> None:
    with pytest.raises(InvalidJob, match="key"):
        JobOptions(key=key)  # type: ignore[arg-type]
    assert queue.counts()["ready"] == 0


def test_a_batch_takes_no_keys(queue: Queue) -> None:
    with pytest.raises(InvalidJob, match="enqueue_many takes no keys"):
        queue.enqueue_many([Call(add, (1, 2), options=JobOptions(key=KEY))])
    assert os.listdir(queue.path / "tmp") == []


def test_submitters_racing_for_one_key_make_one_job(queue: Queue, tmp_path: Path) -> None:
    """Eight processes enqueue the same keys at the same moment: one job per key, and
    every process gets its id."""
    start = tmp_path / "start"
    keys = [f"race-{n}" for n in range(5)]
    children = []
    for n in range(8):
        pid = os.fork()
        if pid == 0:
            try:  # a child: wait for the start, enqueue, report the ids
                while not start.exists():
                    time.sleep(0.001)
                mine = Queue(queue.path, create=False)
                got = [mine.with_options(key=key).enqueue(add, n, n) for key in keys]
                (tmp_path / f"got-{n}").write_text(" ".join(got))
            finally:
                os._exit(0)
        children.append(pid)
    start.touch()
    for pid in children:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    got = [(tmp_path / f"got-{n}").read_text().split() for n in range(8)]
    assert all(ids == got[0] for ids in got), got
    assert sorted(job.id for job in queue.jobs(State.READY)) == sorted(got[0])
    assert os.listdir(queue.path / "tmp") == []


def test_a_submitter_killed_after_taking_the_key_holds_it_until_its_job_is_cleared(queue: Queue) -> None:
    pid = os.fork()
    if pid == 0:

        def die(name: str) -> None:
            if name == "enqueue:key-reserved":
                os.kill(os.getpid(), signal.SIGKILL)

        job_files.checkpoint_hook = die
        _keyed(Queue(queue.path, create=False))
        os._exit(0)  # not reached
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    (staged,) = os.listdir(queue.path / "tmp")
    assert _keyed(queue) == staged  # it may yet be published: the key is its
    assert queue.counts()["ready"] == 0
    queue.serving.sweep(time.time() + 10, lambda owner: None, tmp_age=1.0)  # the abandoned submission is cleared
    wait_until(lambda: not os.listdir(queue.path / "tmp"), 5, "tmp/ was cleared")
    fresh = _keyed(queue)
    assert fresh != staged
    assert [job.id for job in queue.jobs(State.READY)] == [fresh]


def test_retry_takes_the_key_again_or_says_who_holds_it(queue: Queue) -> None:
    first = _keyed(queue)
    queue.cancel(first)
    second = _keyed(queue)
    with pytest.raises(WrongState, match=f"held by job {second}"):
        queue.retry(first)
    assert queue.job(first).state is State.DEAD
    queue.cancel(second)
    queue.retry(first)
    assert queue.job(first).state is State.READY
    assert _keyed(queue) == first


def test_never_two_live_jobs_of_one_key_while_submitters_and_a_manager_race(procs: Processes, tmp_path: Path) -> None:
    """Four processes keep enqueueing one key while a manager runs its jobs to the end:
    every look at the queue finds at most one unfinished job of the key, and every job
    that ran held the key alone."""
    queue = Queue(tmp_path / "q")
    stop = tmp_path / "stop"
    submitters = []
    for n in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                mine = Queue(queue.path, create=False)
                while not stop.exists():
                    mine.with_options(key="hot").enqueue(sample_jobs.ok, n)
            finally:
                os._exit(0)
        submitters.append(pid)
    manager = procs.manager(queue)
    looks = 0
    deadline = time.monotonic() + 3.0
    try:
        while time.monotonic() < deadline:
            manager.step(0.002)
            live = [job for state in (State.READY, State.SCHEDULED, State.CLAIMED) for job in queue.jobs(state)]
            assert len(live) <= 1, [(job.id, job.state.value) for job in live]
            looks += 1
    finally:
        stop.touch()
        for pid in submitters:
            os.waitpid(pid, 0)
    unfinished = (State.READY, State.CLAIMED)
    wait_until(lambda: not any(queue.jobs(s) for s in unfinished), 10, "the last ran", manager=manager)
    done = queue.counts()["done"]
    assert done >= 3, f"only {done} jobs ran in 3 s"  # the key was free again after each
    assert looks > 100
    assert queue.counts()["dead"] == 0


def test_a_hand_written_job_with_a_bad_key_is_invalid(queue: Queue) -> None:
    """A key is checked where every job.json is read, not only by enqueue."""
    job_id = new_job_id()
    folder = queue.path / "ready" / f"100.{job_id}"
    folder.mkdir()
    (folder / "job.json").write_text('{"function": "sample.ok", "args": [], "key": "two\\nlines"}')
    owner = Owner.new()
    queue.serving.register_owner(owner)
    assert queue.serving.claim(owner.name) is None
    found = queue.job(job_id)
    assert found.state is State.DEAD
    assert "key" in (found.error or {}).get("message", "")
