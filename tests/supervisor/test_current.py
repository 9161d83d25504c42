"""Inside a job (issue 14): `jobs.current()` says which run this is, `progress()` records
how far it is (shown by `status`, `show` and `show --json`), and `current().queue`
takes follow-up work; the same for a Python program run as a command job."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from jobs import NotInJob, Queue, State, command_call, context, current, run_folder
from tests import sample_jobs
from tests.processes import Processes, dump, settle, wait_until


def test_a_job_knows_which_run_it_is(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.who_am_i)
    settle(procs.manager(queue), queue, [job_id])
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    result = found.result
    assert (result["job_id"], result["attempt"], result["function"]) == (job_id, 1, "sample.who_am_i")
    assert result["queue"] == str(queue.path)
    assert result["run"].startswith(f"{queue.path}/claimed/")
    assert result["run"].endswith(f"/{job_id}/attempt-1")


def test_a_command_job_in_python_knows_it_too(procs: Processes, queue: Queue) -> None:
    program = "import jobs; c = jobs.current(); print(c.job_id, c.attempt, c.function)"
    [job_id] = queue.enqueue_many([command_call([sys.executable, "-c", program])])
    settle(procs.manager(queue), queue, [job_id], timeout=20)
    found = queue.job(job_id)
    assert found.state is State.DONE, dump(found)
    assert (found.history[-1].path / "stdout").read_text() == f"{job_id} 1 forkvisor.command\n"


def test_outside_a_job_current_says_so() -> None:
    with pytest.raises(NotInJob, match="inside a job a forkvisor manager runs"):
        current()


def test_progress_shows_in_status_and_show(procs: Processes, queue: Queue, barriers: Path) -> None:
    ready, release = barriers / "ready", barriers / "release"
    job_id = queue.enqueue(sample_jobs.progress_then_wait, str(ready), str(release), 10)
    manager = procs.run_manager(queue)
    wait_until(ready.exists, 10, "the job said how far it was")

    status = procs.forkvisor("status", str(queue.path), name="status")
    assert procs.wait_exit(status, 10, "forkvisor status") == 0
    assert "progress 3/10 (30%) three done" in procs.log(status), procs.log(status)
    show = procs.forkvisor("show", str(queue.path), job_id, name="show")
    assert procs.wait_exit(show, 10, "forkvisor show") == 0
    assert "progress  3/10 (30%) three done" in procs.log(show), procs.log(show)
    as_json = procs.forkvisor("show", "--json", str(queue.path), job_id, name="json")
    assert procs.wait_exit(as_json, 10, "forkvisor show --json") == 0
    record = json.loads(procs.log(as_json).strip().splitlines()[-1])["progress"]
    assert (record["done"], record["total"], record["message"]) == (3, 10, "three done")

    release.touch()
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the job finished")
    last = json.loads((queue.job(job_id).history[-1].path / run_folder.PROGRESS_FILE).read_text())
    assert (last["done"], last["total"]) == (10, 10), "the last call of a tight loop was not written"
    manager.terminate()
    assert procs.wait_exit(manager, 10, "drained manager") == 0


def test_a_job_enqueues_follow_up_work_into_its_own_queue(procs: Processes, queue: Queue) -> None:
    job_id = queue.enqueue(sample_jobs.follow_up, "next")
    manager = procs.manager(queue)
    wait_until(lambda: queue.job(job_id).state is State.DONE, 10, "the first job finished", manager=manager)
    follow_id = queue.job(job_id).result
    settle(manager, queue, [follow_id])
    assert queue.job(follow_id).result["value"] == "next"


@pytest.mark.parametrize(("done", "total"), [(-1, None), ("3", None), (1, 0), (True, None)])
def test_bad_progress_is_refused(done: object, total: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "FORKVISOR_QUEUE": str(tmp_path),
        "FORKVISOR_JOB_ID": "x",
        "FORKVISOR_ATTEMPT": "1",
        "FORKVISOR_ATTEMPT_DIR": str(tmp_path),
        "FORKVISOR_FUNCTION": "f",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(context, "_current", None)
    with pytest.raises(ValueError, match="progress"):
        current().progress(done, total)  # type: ignore[arg-type]
