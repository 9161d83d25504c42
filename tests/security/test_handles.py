"""No path is trusted twice (issue 18, class "a folder swapped for a symlink after start-up").

The manager, its sweeper and its children reach the queue through folder handles opened
once (`jobs/handles.py`). Each attack here swaps a folder for a link to a folder outside
the queue while a manager serves it, then checks that nothing outside was read, moved or
written (`Outside.check`), that the manager said so and stopped (exit 111, one line), and
that, the folder put back, every job is in exactly one place.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs import Queue, QueueError, State
from tests import sample_jobs
from tests.faults.conftest import Outside, cli_manager
from tests.jobs_processes.invariants import check_invariants
from tests.processes import Processes, dump, wait_until


def _swap_for_link(queue: Queue, folder: str, target: Path) -> Path:
    """Move `folder` of the queue aside and put a link to `target` in its place."""
    moved = queue.path / f"{folder}.moved"
    os.rename(queue.path / folder, moved)
    os.symlink(target, queue.path / folder)
    return moved


def _put_back(queue: Queue, folder: str, moved: Path) -> None:
    os.unlink(queue.path / folder)
    os.rename(moved, queue.path / folder)


@pytest.mark.parametrize("folder", ["ready", "scheduled", "claimed", "done", "tmp", "incoming"])
def test_a_state_folder_swapped_for_a_link_is_refused_loudly_and_never_followed(
    procs: Processes, queue: Queue, barriers: Path, outside: Outside, folder: str
) -> None:
    started, release = barriers / "started", barriers / "release"
    running = queue.enqueue(sample_jobs.wait_release, str(started), str(release))
    later = queue.with_options(delay=3600).enqueue(sample_jobs.ok, "in scheduled/")
    with cli_manager(procs, queue) as manager:
        wait_until(started.exists, 10, "the job started")
        moved = _swap_for_link(queue, folder, outside.folder)
        try:
            with pytest.raises(QueueError, match=rf"{folder}/ is not a plain folder"):
                Queue(queue.path).enqueue(sample_jobs.ok, "through the link")  # a new opener refuses it too
            release.touch()  # the running job finishes through the handles opened before the swap
            assert procs.wait_exit(manager, 30, "the manager stops") == 111, procs.log(manager)
        finally:
            _put_back(queue, folder, moved)
    log = procs.log(manager)
    assert f"{folder}/ of queue {queue.path} was replaced while this process used it" in log, log
    assert "Traceback" not in log, log
    outside.check()  # nothing outside the queue was listed, read, moved or written
    assert queue.job(running).state is State.DONE, dump(queue.job(running))
    assert queue.job(running).result == "released"
    check_invariants(queue.path, [running, later])


def test_a_job_that_puts_a_link_in_place_of_its_run_folder_redirects_no_write(
    procs: Processes, queue: Queue, outside: Outside
) -> None:
    """The job runs as the queue's owner and may rename its own run folder: the manager's
    record of the run (outcome.json) and the child's own files never follow the link."""
    job_id = queue.enqueue(sample_jobs.swap_own_run, str(outside.jobs))
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the job finished", manager=manager)
    outside.check()  # no outcome.json, result.json or stdout landed in the folder the link points at
    job = queue.job(job_id)
    [run] = job.history
    assert not run.path.is_symlink(), "the record went into a folder of its own"
    assert run.path.is_dir()
    assert run.outcome is not None, dump(job)
    assert run.outcome["succeeded"] is True, dump(job)
    moved = job.path / "attempt-1.moved"
    assert (moved / "result.json").read_text() == '"swapped"\n', "the child wrote through its own handle"
    quarantined = [path.read_text() for path in (queue.path / "quarantine").glob("*.why")]
    assert any("the folder of run 1 was replaced while it ran" in note for note in quarantined), quarantined
    check_invariants(queue.path, [job_id])
