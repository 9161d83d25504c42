"""Firing schedules (`jobs.planner`, `jobs.ticks`): one job per tick whatever the number
of firers racing, through SIGKILLs at each step, and the missed-tick policies seen
from the queue folder."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from jobs import Queue, Registry, Schedule, State, Timing
from jobs import files as job_files
from jobs import ticks as tick_marks
from jobs.ticks import STALE, tick_job_id
from tests import sample_jobs
from tests.jobs_processes.invariants import check_invariants

T0 = 1_800_000_000.0  # a multiple of 10 s: ticks of "every 10s" fall on it


def add(queue: Queue, name: str = "s", when: str = "every 10s", missed: str = "once", created: float = T0) -> Schedule:
    made = Schedule(name=name, timing=Timing(when), function="tasks.work", args=(name,), missed=missed, created=created)
    queue.add_schedule(made)
    return made


def _tick(queue: Queue, name: str, tick: float) -> str:
    """The id of a tick's job in this queue (derived with the queue's tick secret)."""
    return tick_job_id(name, tick, tick_marks.secret(queue.folder))


def tick_jobs(queue: Queue, name: str = "s") -> dict[int, list[str]]:
    """The jobs of schedule `name` anywhere in the queue, by tick."""
    found: dict[int, list[str]] = {}
    for state in State:
        if state is State.INCOMING:
            continue
        for job in queue.jobs(state):
            if job.spec.metadata.get("schedule") == name:
                found.setdefault(job.spec.metadata["tick"], []).append(job.id)
    return found


def test_each_tick_enqueues_one_job_named_by_its_tick(queue: Queue) -> None:
    add(queue)
    planner = queue.serving.planner()
    assert planner.fire(T0 + 5, 0.0) == (0, T0 + 10)
    assert planner.fire(T0 + 10, 5.0) == (1, T0 + 20)
    assert planner.fire(T0 + 12, 7.0) == (0, T0 + 20), "a tick fires once"
    assert planner.fire(T0 + 21, 16.0)[0] == 1
    assert tick_jobs(queue) == {int(T0 + 10): [_tick(queue, "s", T0 + 10)], int(T0 + 20): [_tick(queue, "s", T0 + 20)]}
    job = queue.job(_tick(queue, "s", T0 + 10))
    assert (job.state, job.spec.function, list(job.spec.args)) == (State.READY, "tasks.work", ["s"])
    assert sorted(os.listdir(queue.path / "ticks" / "s")) == [f"{int(T0 + 10):010d}", f"{int(T0 + 20):010d}"]


def test_ids_of_two_schedules_at_one_tick_differ_and_sort_by_time() -> None:
    assert tick_job_id("a", T0) != tick_job_id("b", T0)
    assert tick_job_id("a", T0, b"one secret") != tick_job_id("a", T0, b"another"), "unguessable without it"
    suffixes = {tick_job_id("a", T0 + n, b"one secret")[16:] for n in range(100)}
    assert len(suffixes) == 100, "one tick's id tells nothing of the next one's"
    assert tick_job_id("a", T0) < tick_job_id("a", T0 + 1)
    assert tick_job_id("a", T0).startswith("20270115-080000-")


def test_firers_racing_in_many_processes_enqueue_each_tick_once(queue: Queue) -> None:
    add(queue, missed="all")
    add(queue, name="other", when="every 20s", missed="all")
    moments = [T0 + 3 * n for n in range(41)]  # 120 s: 12 ticks of s, 6 of other
    start = queue.path.parent / "go"
    children = []
    for _ in range(6):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                mine = Queue(queue.path, create=False)
                planner = mine.serving.planner()
                while not start.exists():
                    time.sleep(0.001)
                for moment in moments:
                    planner.fire(moment, moment - T0)
                code = 0
            finally:
                os._exit(code)
        children.append(pid)
    start.touch()
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    for name, step, count in (("s", 10, 12), ("other", 20, 6)):
        found = tick_jobs(queue, name)
        assert sorted(found) == [int(T0) + step * n for n in range(1, count + 1)], f"{name}: a tick missed"
        assert all(len(ids) == 1 for ids in found.values()), f"{name}: a tick fired twice: {found}"
    assert os.listdir(queue.path / "tmp") == []


def test_missed_ticks_follow_the_policy(queue: Queue) -> None:
    for policy in ("skip", "once", "all"):
        add(queue, name=policy, missed=policy)
    planner = queue.serving.planner()
    planner.fire(T0 + 95, 0.0)  # nine ticks passed since the schedules were made
    assert len(tick_jobs(queue, "once")) == 1
    assert sorted(tick_jobs(queue, "all")) == [int(T0) + 10 * n for n in range(1, 10)]
    assert sorted(tick_jobs(queue, "skip")) == [int(T0 + 90)], "5 s late is within the grace"
    planner.fire(T0 + 505, 410.0)  # 41 ticks later: once and skip fire the newest (5 s late)
    assert sorted(tick_jobs(queue, "skip")) == sorted(tick_jobs(queue, "once")) == [int(T0 + 90), int(T0 + 500)]
    assert len(tick_jobs(queue, "all")) == 50


def test_a_clock_jump_fires_one_tick_even_for_all(queue: Queue) -> None:
    add(queue, missed="all")
    planner = queue.serving.planner()
    planner.fire(T0 + 1, 1.0)
    planner.fire(T0 + 86400, 2.0)  # the wall clock moved a day in a second of monotonic time
    assert sorted(tick_jobs(queue)) == [int(T0 + 86400)]


def test_a_paused_schedule_fires_nothing_and_its_ticks_are_skipped(queue: Queue) -> None:
    add(queue)
    queue.pause_schedule("s")
    planner = queue.serving.planner()
    planner.fire(T0 + 35, 0.0)
    assert tick_jobs(queue) == {}
    assert queue.schedule("s", now=T0 + 35).paused
    queue.pause_schedule("s", paused=False)
    planner.fire(T0 + 36, 1.0)
    assert tick_jobs(queue) == {}, "the ticks passed while paused are not caught up"
    planner.fire(T0 + 40, 5.0)
    assert sorted(tick_jobs(queue)) == [int(T0 + 40)]


def test_a_declared_schedule_starts_at_its_first_sight_and_is_described(queue: Queue) -> None:
    registry = Registry()
    registry.periodic("every 10s", name="py")(sample_jobs.ok)
    [schedule] = registry.schedules
    planner = queue.serving.planner([schedule])
    planner.fire(T0 + 95, 0.0)
    assert tick_jobs(queue, "py") == {}, "ticks before it was first served are not missed ones"
    planner.fire(T0 + 100, 5.0)
    assert sorted(tick_jobs(queue, "py")) == [int(T0 + 100)]
    (listed,) = queue.schedules(now=T0 + 101)
    assert (listed.schedule.name, listed.schedule.source, listed.last_job) == (
        "py",
        "python",
        _tick(queue, "py", T0 + 100),
    )
    assert listed.next_tick == T0 + 110
    assert listed.last_state is State.READY


def test_only_the_newest_markers_are_kept(queue: Queue) -> None:
    add(queue, missed="all")
    planner = queue.serving.planner()
    for n in range(1, 41):
        planner.fire(T0 + 10 * n, float(n))
    markers = os.listdir(queue.path / "ticks" / "s")
    assert len(markers) == 20
    assert max(markers) == f"{int(T0 + 400):010d}"
    assert len(tick_jobs(queue)) == 40


def test_a_bad_schedule_file_stops_no_other_schedule(queue: Queue) -> None:
    add(queue)
    (queue.path / "schedules" / "broken.json").write_text("{not json")
    (queue.path / "schedules" / "deep.json").write_text("[" * 5000 + "]" * 5000)
    os.symlink("/etc/passwd", queue.path / "schedules" / "link.json")
    planner = queue.serving.planner()
    assert planner.fire(T0 + 10, 0.0)[0] == 1
    assert set(planner.bad) == {"broken.json", "deep.json", "link.json"}
    assert [info.schedule.name for info in queue.schedules(now=T0)] == ["s"]


def _fire_and_die_at(queue: Queue, point: str, moment: float) -> None:
    pid = os.fork()
    if pid == 0:

        def die(name: str) -> None:
            if name == point:
                os.kill(os.getpid(), signal.SIGKILL)

        job_files.checkpoint_hook = die
        Queue(queue.path, create=False).serving.planner().fire(moment, 0.0)
        os._exit(0)  # not reached
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status), f"the firer was not killed at {point}"


def test_a_firer_killed_after_taking_the_tick_has_its_job_published_by_a_sweep(queue: Queue) -> None:
    add(queue)
    _fire_and_die_at(queue, "tick:taken", T0 + 10)
    job_id = _tick(queue, "s", T0 + 10)
    assert os.listdir(queue.path / "tmp") == [job_id]
    assert queue.serving.planner().fire(T0 + 11, 1.0)[0] == 0, "the tick is taken: no second job"
    swept_at = (queue.path / "tmp" / job_id).stat().st_mtime
    assert queue.serving.sweep(swept_at + STALE / 2, lambda owner: None)["abandoned"] == 0
    assert os.listdir(queue.path / "tmp") == [job_id], "its firer may only be slow: too early to publish"
    assert queue.serving.sweep(swept_at + STALE + 1, lambda owner: None)["abandoned"] == 1
    assert os.listdir(queue.path / "tmp") == []
    assert queue.job(job_id).state is State.READY
    assert tick_jobs(queue) == {int(T0 + 10): [job_id]}
    check_invariants(queue.path, [job_id])  # in exactly one place, no other job anywhere


def test_a_firer_killed_before_taking_the_tick_leaves_it_to_be_fired_again(queue: Queue) -> None:
    add(queue)
    _fire_and_die_at(queue, "enqueue:staged", T0 + 10)
    job_id = _tick(queue, "s", T0 + 10)
    assert os.listdir(queue.path / "tmp") == [job_id]
    assert not (queue.path / "ticks" / "s" / f"{int(T0 + 10):010d}").exists()
    assert queue.serving.planner().fire(T0 + 11, 1.0)[0] == 0, "the staged job is another firer's, maybe alive"
    queue.serving.sweep(time.time() + 10, lambda owner: None, tmp_age=1.0)  # its writer is dead: quarantined
    assert os.listdir(queue.path / "tmp") == []
    assert queue.serving.planner().fire(T0 + 12, 2.0)[0] == 1, "the tick is still the newest passed: fired now"
    assert tick_jobs(queue) == {int(T0 + 10): [job_id]}
    check_invariants(queue.path, [job_id])
    why = [name for name in os.listdir(queue.path / "quarantine") if name.endswith(".why")]
    assert len(why) == 1


def test_a_job_in_tmp_that_only_looks_like_a_tick_is_left_to_the_usual_rule(queue: Queue) -> None:
    add(queue)
    job_id = _tick(queue, "s", T0 + 10)
    staged = queue.path / "tmp" / job_id
    staged.mkdir()
    (staged / "job.json").write_text(json.dumps({"function": "f", "metadata": {"schedule": "s", "tick": int(T0 + 10)}}))
    old = time.time() - 2 * STALE
    os.utime(staged, (old, old))
    queue.serving.sweep(time.time(), lambda owner: None)  # no marker names it: not published
    assert os.listdir(queue.path / "tmp") == [job_id]


@pytest.mark.parametrize("missed", ["once", "all"])
def test_a_schedule_added_again_does_not_fire_its_old_ticks_again(queue: Queue, missed: str) -> None:
    add(queue, missed=missed)
    queue.serving.planner().fire(T0 + 30, 0.0)
    before = tick_jobs(queue)
    queue.remove_schedule("s")
    add(queue, missed=missed, created=T0)
    queue.serving.planner().fire(T0 + 30, 0.0)
    assert tick_jobs(queue) == before
