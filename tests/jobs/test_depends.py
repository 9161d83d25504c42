"""Dependencies (`jobs.depends`): a job waits in waiting/ until the jobs it depends on
are done; a dead one kills its dependents (unless they allow failure), in cascade; the
end of a job and the settling of its dependents are two steps, and a sweep repairs a
crash between them; submitters and settlers racing never leave a job waiting for ever."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import traceback

import pytest

from jobs import TMP_AGE, Call, InvalidJob, JobOptions, Owner, Queue, State, depends, new_job_id
from jobs import files as job_files
from jobs.job import ready_name
from tests.jobs.conftest import Hand, add
from tests.jobs_processes.invariants import check_invariants


def after(queue: Queue, *parents: str, **options: object) -> str:
    return queue.with_options(depends_on=list(parents), **options).enqueue(add, 1, 2)


def finish(queue: Queue, job_id: str, ok: bool = True, settle: bool = True) -> None:
    """Claim `job_id` (the only ready job), complete it or fail it for good, then settle its
    dependents as its manager would (unless `settle` is False: a manager that died there)."""
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert claim.job_id == job_id
    if ok:
        (claim.path / f"attempt-{claim.run}" / "result.json").write_text("3")
        queue.serving.complete(claim)
    else:
        queue.serving.fail(claim, {"message": "broken"}, permanent=True)
    queue.serving.retire_owner(owner.name)
    if settle:
        queue.serving.settle_dependents(job_id)


def state(queue: Queue, job_id: str) -> State:
    return queue.job(job_id).state


def test_a_dependent_waits_and_is_ready_once_its_parent_is_done(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    child = after(queue, parent)
    assert state(queue, child) is State.WAITING
    assert queue.counts()["waiting"] == 1
    assert os.listdir(queue.path / "edges" / parent) == [child]
    finish(queue, parent)
    assert state(queue, child) is State.READY
    assert (queue.path / "ready" / ready_name(child, 0)).is_dir()
    assert not (queue.path / "edges" / parent).exists(), "the edges of a settled parent are removed"
    assert "ready: the jobs it depends on are done" in "".join(queue.events(child))


def test_fan_in_waits_for_every_parent(queue: Queue) -> None:
    parents, child = queue.fan_in([Call(add, (n, n)) for n in range(3)], Call(add, (0, 0)))
    for parent in parents[:-1]:
        finish(queue, parent)
        assert state(queue, child) is State.WAITING
    finish(queue, parents[-1])
    assert state(queue, child) is State.READY


def test_a_chain_runs_one_after_the_other(queue: Queue) -> None:
    ids = queue.chain([Call(add, (n, n)) for n in range(4)])
    assert [state(queue, job_id) for job_id in ids] == [State.READY] + [State.WAITING] * 3
    for n, job_id in enumerate(ids):
        finish(queue, job_id)
        if n + 1 < len(ids):
            assert state(queue, ids[n + 1]) is State.READY
    assert queue.counts()["done"] == 4


def test_a_dead_parent_kills_its_dependents_in_cascade_naming_it(queue: Queue) -> None:
    first, second, third = queue.chain([Call(add, (n, n)) for n in range(3)])
    survivor = after(queue, first, allow_failure=True)
    finish(queue, first, ok=False)
    for job_id in (second, third):
        dead = queue.job(job_id)
        assert dead.state is State.DEAD
        assert dead.error["reason"] == "dependency dead"
    assert first in queue.job(second).error["message"]
    assert second in queue.job(third).error["message"], "each names the job that killed it"
    assert state(queue, survivor) is State.READY, "allow_failure runs it anyway"


def test_a_parent_done_before_the_enqueue_releases_the_job_at_once(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    finish(queue, parent)
    assert state(queue, after(queue, parent)) is State.READY


@pytest.mark.parametrize(
    ("parents", "says"),
    [
        (["20200101-000000-000000-0badc0de"], "there is no job 20200101-000000-000000-0badc0de"),
        (["not-an-id"], "not a job id"),
        ("20200101-000000-000000-0badc0de", "a list of job ids"),
    ],
)
def test_bad_dependencies_are_refused_before_anything_is_written(queue: Queue, parents: object, says: str) -> None:
    with pytest.raises(InvalidJob, match=says):
        queue.with_options(depends_on=parents).enqueue(add, 1, 2)
    assert os.listdir(queue.path / "tmp") == []
    assert os.listdir(queue.path / "edges") == []


def test_options_that_cannot_go_with_dependencies(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    with pytest.raises(InvalidJob, match="no delay or run_at"):
        JobOptions(depends_on=[parent], delay=5)
    with pytest.raises(InvalidJob, match="enqueue_many takes no keys or depends_on"):
        queue.enqueue_many([Call(add, (1, 2), options=JobOptions(depends_on=[parent]))])


def test_a_crash_between_a_parents_end_and_the_settling_is_repaired_by_a_sweep(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    child, dead_parent = after(queue, parent), queue.enqueue(add, 2, 2)
    orphan = after(queue, dead_parent)
    finish(queue, parent, settle=False)
    finish(queue, dead_parent, ok=False, settle=False)
    assert state(queue, child) is State.WAITING
    done = queue.serving.sweep(time.time(), lambda owner: None)
    assert done["settled"] == 2
    assert state(queue, child) is State.READY
    assert state(queue, orphan) is State.DEAD
    assert os.listdir(queue.path / "edges") == []


def test_edges_of_a_parent_that_is_nowhere_are_cleared_by_a_sweep(queue: Queue) -> None:
    """A parent found nowhere: purged (it ended), its dependents are settled as for a done
    parent; never purged (a member's parent refused at its take-in, a quarantined job),
    after TMP_AGE its dependents are buried (once they ran as if it were done). Either way
    its edges go, instead of being walked by every sweep for ever. A parent that is merely
    scheduled keeps its edges."""
    live = queue.with_options(delay=3600).enqueue(add, 1, 1)  # in scheduled/: found only by a listing
    waits_on_live = after(queue, live)
    ghost, purged = new_job_id(time.time() - 60), new_job_id(time.time() - 61)
    waits_on_ghost, waits_on_purged = after(queue, live), after(queue, live)
    for parent, child in ((ghost, waits_on_ghost), (purged, waits_on_purged)):
        (queue.path / "edges" / parent).mkdir()
        (queue.path / "edges" / parent / child).write_text("")
    (queue.path / "purged.log").write_text(f"2026-01-01T00:00:00Z purged done {purged}\n")
    queue.serving.sweep(time.time(), lambda owner: None)
    assert sorted(os.listdir(queue.path / "edges")) == sorted([live, ghost]), "the purged parent's edges went"
    assert state(queue, waits_on_purged) is State.WAITING, "it still waits for its live parent"
    queue.serving.sweep(time.time() + TMP_AGE + 1, lambda owner: None)
    assert sorted(os.listdir(queue.path / "edges")) == [live], "the ghost's edges went, the live parent's stay"
    assert sorted(os.listdir(queue.path / "edges" / live)) == sorted([waits_on_live, waits_on_purged, waits_on_ghost])
    assert state(queue, waits_on_ghost) is State.DEAD, "a parent that will never end"
    assert "never purged" in queue.job(waits_on_ghost).error["message"]


@pytest.mark.parametrize("purged", [False, True])
def test_a_parent_that_is_nowhere_counts_as_done_only_if_it_was_purged(queue: Queue, purged: bool) -> None:
    """Once: a parent found nowhere counted as done whatever the reason, so a member whose
    own submission was refused at its take-in (or any parent quarantined, or removed by
    hand) had its dependent run when its other parent ended, as if that one had too. Now
    only a parent `purged.log` names counts as done; another is waited for, and a sweep
    buries its dependents once it stayed nowhere for TMP_AGE."""
    gone, other = queue.enqueue(add, 1, 1), queue.enqueue(add, 2, 2)
    child = after(queue, gone, other)
    shutil.rmtree(queue.job(gone).path)  # nowhere now, by no end of its own
    if purged:
        (queue.path / "purged.log").write_text(f"2026-01-01T00:00:00Z purged done {gone}\n")
    finish(queue, other)
    if purged:
        assert state(queue, child) is State.READY, "a purged parent ended before it went"
        return
    assert state(queue, child) is State.WAITING, "its parent that is nowhere never ended"
    queue.serving.sweep(time.time() + TMP_AGE + 1, lambda owner: None)
    assert state(queue, child) is State.DEAD
    assert "never purged" in queue.job(child).error["message"]


def test_a_members_thousand_parents_that_do_not_exist_bury_it_at_take_in(queue: Queue, hand: Hand) -> None:
    """One look per parent at the places its id names, one listing of scheduled/ for all of
    them (each was once looked for by listings, three times: 110 s for a thousand)."""
    ghosts = [new_job_id(time.time() - 3600 + n) for n in range(1000)]
    job_id = hand.submission({"function": "tests.jobs.conftest.add", "args": [1, 2], "depends_on": ghosts})
    assert queue.serving.take_in() == 1
    dead = queue.job(job_id)
    assert dead.state is State.DEAD
    assert f"there is no job {ghosts[0]}" in dead.error["message"]
    assert os.listdir(queue.path / "edges") == [], "no edge was written for a parent that is not a job"


def test_a_cancelled_waiting_job_is_dead_and_so_are_its_dependents_after_a_sweep(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    middle = after(queue, parent)
    last = after(queue, middle)
    assert queue.cancel(middle) is State.DEAD
    queue.serving.sweep(time.time(), lambda owner: None)
    assert queue.job(last).error["reason"] == "dependency dead"
    finish(queue, parent)
    assert queue.counts()["waiting"] == 0


def test_retrying_a_dead_dependent_waits_for_its_parents_again(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    child = after(queue, parent)
    finish(queue, parent, ok=False)
    assert state(queue, child) is State.DEAD
    queue.retry(parent)
    queue.retry(child)
    assert state(queue, child) is State.WAITING, "its parent is ready again, not done"
    finish(queue, parent)
    assert state(queue, child) is State.READY


def test_a_job_written_into_ready_by_hand_with_dependencies_waits_for_them(queue: Queue) -> None:
    parent = queue.enqueue(add, 1, 1)
    job_id = "20261125-000000-000000-00c0ffee"
    place = queue.path / "ready" / ready_name(job_id, -5)
    place.mkdir()
    spec = {"function": "tests.jobs.conftest.add", "args": [1, 2], "priority": -5, "depends_on": [parent]}
    (place / "job.json").write_text(json.dumps(spec))
    finish(queue, parent)  # claims the parent (priority 0 first); the hand-written job waits
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    assert claim.job_id == job_id, "its parent is done: it runs"
    second = "20261125-000000-000001-00c0ffee"
    blocker = queue.enqueue(add, 5, 5)
    place = queue.path / "ready" / ready_name(second, -5)
    place.mkdir()
    (place / "job.json").write_text(json.dumps({**spec, "depends_on": [blocker]}))
    queue.serving.register_owner(other := Owner.new())
    first = queue.serving.claim(other.name)
    assert first is not None
    assert first.job_id == blocker
    assert queue.serving.claim(other.name) is None, "a job whose parent runs is not claimed"
    assert state(queue, second) is State.WAITING
    assert os.listdir(queue.path / "edges" / blocker) == [second]


def test_a_members_submission_with_dependencies_is_taken_in_to_wait(queue: Queue, hand: Hand) -> None:
    parent = queue.enqueue(add, 1, 1)
    document = {"function": "tests.jobs.conftest.add", "args": [1, 2], "depends_on": [parent]}
    job_id = hand.submission(document)
    queue.serving.take_in()
    assert state(queue, job_id) is State.WAITING
    finish(queue, parent)
    assert state(queue, job_id) is State.READY


def test_a_job_that_names_itself_as_a_dependency_is_invalid(queue: Queue, hand: Hand) -> None:
    job_id = new_job_id(time.time() + 5)
    hand.submission({"function": "f", "depends_on": [job_id]}, job_id)
    queue.serving.take_in()
    dead = queue.job(job_id)
    assert dead.state is State.DEAD
    assert "depends on itself" in dead.error["message"]


def test_submitters_racing_a_parents_end_never_leave_a_job_waiting(queue: Queue) -> None:
    """Eight processes enqueue dependents of one parent while it is completed and its
    dependents settled: each dependent ends ready (the submitter or the settler saw the end)."""
    for _ in range(5):
        parent = queue.enqueue(add, 1, 1)
        go = queue.path.parent / f"go-{parent}"
        children = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    mine = Queue(queue.path, create=False)
                    while not go.exists():
                        time.sleep(0.0005)
                    for _ in range(5):
                        after(mine, parent)
                    code = 0
                except BaseException:
                    traceback.print_exc()  # shown by pytest with the failure
                finally:
                    os._exit(code)
            children.append(pid)
        go.touch()
        finish(queue, parent)
        for pid in children:
            assert os.waitpid(pid, 0)[1] == 0
        assert queue.counts()["waiting"] == 0, "a dependent of a done parent waits for ever"
        while (claim := queue.serving.claim(owner_name(queue))) is not None:
            queue.serving.complete(claim)


def owner_name(queue: Queue) -> str:
    owner = Owner.new()
    queue.serving.register_owner(owner)
    return owner.name


@pytest.mark.parametrize("point", ["enqueue:edges-written", "enqueue:waiting"])
def test_a_submitter_killed_mid_enqueue_leaves_nothing_waiting_for_ever(queue: Queue, point: str) -> None:
    parent = queue.enqueue(add, 1, 1)
    pid = os.fork()
    if pid == 0:

        def die(name: str) -> None:
            if name == point:
                os.kill(os.getpid(), signal.SIGKILL)

        job_files.checkpoint_hook = die
        after(Queue(queue.path, create=False), parent)
        os._exit(0)  # not reached
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    waiting = os.listdir(queue.path / "waiting")
    finish(queue, parent)
    queue.serving.sweep(time.time() + 7200, lambda owner: None)  # clears tmp/ (an abandoned submission)
    assert os.listdir(queue.path / "waiting") == []
    assert os.listdir(queue.path / "edges") == []
    if point == "enqueue:waiting":  # published: it runs
        assert [job.id for job in queue.jobs(State.READY)] == waiting
    check_invariants(queue.path, [parent, *waiting])


def test_an_edge_folder_removed_by_a_settler_mid_enqueue_is_made_again(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submitter finds edges/PARENT there, then the parent's settler removes it (empty)
    before the edge is written: the submitter makes it again (found by CI, where eight
    submitters racing a parent's end had one fail with FileNotFoundError)."""
    parent = queue.enqueue(add, 1, 1)
    after(queue, parent)  # edges/PARENT exists
    real = depends._write_edge
    removed: list[str] = []

    def settler_first(folder: object, of: str, child: str) -> None:
        if not removed:
            for name in os.listdir(queue.path / "edges" / of):
                os.unlink(queue.path / "edges" / of / name)
            os.rmdir(queue.path / "edges" / of)  # what `_forget_parent` does once the folder is empty
            removed.append(of)
        real(folder, of, child)  # type: ignore[arg-type]

    monkeypatch.setattr(depends, "_write_edge", settler_first)
    child = after(queue, parent)
    assert removed == [parent]
    assert os.listdir(queue.path / "edges" / parent) == [child]
    finish(queue, parent)
    assert state(queue, child) is State.READY


def test_a_parent_dying_in_the_middle_of_a_fan_in_kills_the_dependent_at_once(queue: Queue) -> None:
    """Its end is judged first, whatever the other parents' places and states."""
    parents, child = queue.fan_in([Call(add, (n, n)) for n in range(5)], Call(add, (0, 0)))
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claims = [queue.serving.claim(owner.name) for _ in parents]  # all running: none has ended
    middle = claims[2]
    assert middle is not None
    queue.serving.fail(middle, {"message": "broken"}, permanent=True)
    queue.serving.settle_dependents(middle.job_id)
    dead = queue.job(child)
    assert dead.state is State.DEAD
    assert middle.job_id in dead.error["message"]
