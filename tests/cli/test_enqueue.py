"""`forkvisor enqueue`: calls of registered functions (tests/sample_jobs.py), their
options as written in job.json, and what a manager with `--app` makes of them."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from jobs import State
from jobs.job import parse_scheduled_name
from tests.cli.conftest import burst, enqueue, job, new_queue, ok, spec_file
from tests.processes import APP, APP_PATH, dump


def due_of(queue: Path, job_id: str) -> float:
    found = job(queue, job_id)
    assert found.state is State.SCHEDULED, dump(found)
    parsed = parse_scheduled_name(found.path.name)
    assert parsed is not None, found.path
    return parsed[2]


def test_enqueue_options_are_written_into_job_json(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    before = time.time()
    job_id = enqueue(
        queue,
        "sample.ok",
        *("--args", '[1, "a", {"nested": [true, null]}]', "--kwargs", '{"colour": "blue"}'),
        *("--max-attempts", "4", "--timeout", "1m30s", "--priority", "7", "--delay", "1h"),
        *("--meta", "team=ops", "--meta", "count=3", "--meta", "note=two words", "--memory-limit", "512M"),
    )
    spec = spec_file(queue, job_id)
    assert spec["function"] == "sample.ok"
    assert spec["args"] == [1, "a", {"nested": [True, None]}]
    assert spec["kwargs"] == {"colour": "blue"}
    assert spec["max_attempts"] == 4
    assert spec["timeout"] == 90.0
    assert spec["priority"] == 7
    assert spec["memory_limit"] == 512 * 2**20
    assert spec["metadata"] == {"team": "ops", "count": 3, "note": "two words"}
    assert before + 3600 - 1 <= due_of(queue, job_id) <= time.time() + 3600 + 1

    [listed] = ok("list", queue, "--json").json()
    assert listed["id"] == job_id
    assert listed["state"] == "scheduled"
    assert listed["priority"] == 7
    assert listed["max_attempts"] == 4


def test_enqueue_at_takes_an_iso_time_or_epoch_seconds(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    local = enqueue(queue, "sample.ok", "--at", "2031-02-03T04:05:06")
    offset = enqueue(queue, "sample.ok", "--at", "2031-02-03 04:05:06+02:00")
    epoch = enqueue(queue, "sample.ok", "--at", "1950000000.5")
    assert due_of(queue, local) == datetime.fromisoformat("2031-02-03T04:05:06").timestamp()
    assert due_of(queue, offset) == datetime.fromisoformat("2031-02-03T04:05:06+02:00").timestamp()
    assert due_of(queue, epoch) == 1950000000.5


def test_enqueue_with_or_without_app_records_only_what_was_given(tmp_path: Path) -> None:
    """The registration's max_attempts=2 applies when a manager claims either job
    (tests/supervisor/test_policy_paths.py); --app checks the name and the arguments."""
    queue = new_queue(tmp_path / "queue")
    registered = enqueue(queue, "sample.fail", "--args", '["boom"]', "--app", APP, *APP_PATH)
    plain = enqueue(queue, "sample.fail", "--args", '["boom"]')
    told = enqueue(queue, "sample.fail", "--args", '["boom"]', "--app", APP, *APP_PATH, "--max-attempts", "1")
    assert "max_attempts" not in spec_file(queue, registered)
    assert "max_attempts" not in spec_file(queue, plain)
    assert spec_file(queue, told)["max_attempts"] == 1
    assert {spec_file(queue, i)["function"] for i in (registered, plain, told)} == {"sample.fail"}


def test_enqueued_calls_run_under_a_manager_with_the_app(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    positional = enqueue(queue, "sample.ok", "--args", '["hi"]')
    keyword = enqueue(queue, "sample.ok", "--kwargs", '{"value": [1, 2]}')
    cannot = enqueue(queue, "sample.cannot", "--args", '["no way"]', "--max-attempts", "3")
    burst(queue)

    found = job(queue, positional)
    assert found.state is State.DONE, dump(found)
    assert found.result is not None
    assert found.result["value"] == "hi"
    found = job(queue, keyword)
    assert found.state is State.DONE, dump(found)
    assert found.result is not None
    assert found.result["value"] == [1, 2]
    found = job(queue, cannot)
    assert found.state is State.DEAD, dump(found)
    assert found.attempts == 1
    assert found.error is not None
    assert found.error["reason"] == "cannot be completed"
    assert "no way" in found.error["message"]
