"""The reading commands: `status` (text, --json, --watch), `list`, `show`, `logs` (--follow)."""

from __future__ import annotations

import json
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jobs import COMMAND, State, is_job_id
from tests.cli.conftest import (
    FAST_RUN,
    burst,
    cli,
    enqueue,
    job,
    new_queue,
    ok,
    printed,
    refused,
    stop_manager,
    submit,
)
from tests.processes import Processes, read_pid, wait_until

FAILING = 'echo "out $FORKVISOR_ATTEMPT"; echo "err $FORKVISOR_ATTEMPT" >&2; exit 3'


@dataclass(frozen=True)
class Finished:
    """A queue that ran once: jobs done, dead (one after two runs), scheduled and ready."""

    queue: Path
    one: str  # sample.ok, done
    two: str  # sample.ok, priority 5, done
    echo: str  # command, done
    cannot: str  # sample.cannot, dead
    failing: str  # command, dead after 2 runs
    later: str  # command, scheduled an hour ahead
    waiting: str  # sample.nap, ready


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    queue = new_queue(tmp_path_factory.mktemp("inspect") / "queue")
    one = enqueue(queue, "sample.ok", "--args", '["one"]')
    two = enqueue(queue, "sample.ok", "--args", '["two"]', "--priority", "5")
    echo = submit(queue, "echo", "hello")
    cannot = enqueue(queue, "sample.cannot", "--args", '["nope"]')
    failing = submit(queue, "sh", "-c", FAILING, options=("--max-attempts", "2"))
    burst(queue)
    later = submit(queue, "true", options=("--delay", "1h"))
    waiting = enqueue(queue, "sample.nap", "--args", "[1]")
    return Finished(queue, one, two, echo, cannot, failing, later, waiting)


# -- status --------------------------------------------------------------------------


def test_status_of_a_queue_without_managers(finished: Finished) -> None:
    taken = ok("status", finished.queue, "--json").json()
    assert set(taken) == {
        "queue",
        "counts",
        "managers",
        "running",
        "oldest_ready_age",
        "unserved",
        "paused",
        "paused_all",
    }
    assert taken["paused"] == ""
    assert taken["unserved"] == {"checked": 1, "functions": {"sample.nap": 1}, "known": True, "count": 1}
    assert taken["queue"] == str(finished.queue)
    assert taken["counts"] == {
        "incoming": 0,
        "ready": 1,
        "scheduled": 1,
        "waiting": 0,
        "claimed": 0,
        "done": 3,
        "dead": 2,
    }
    assert taken["managers"] == []
    assert taken["running"] == []
    assert taken["oldest_ready_age"] > 0

    text = ok("status", finished.queue).out
    assert str(finished.queue) in text
    assert "ready 1  scheduled 1  waiting 0  claimed 0  done 3  dead 2" in text
    assert "managers: none" in text
    assert "running: none" in text


def test_status_shows_the_manager_and_a_running_job(procs: Processes, tmp_path: Path, barriers: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    script = "echo started; while [ ! -e release ]; do sleep 0.05; done"
    running_id = submit(queue, "sh", "-c", script, cwd=barriers)
    queued_id = submit(queue, "true")
    manager = procs.forkvisor("run", str(queue), *FAST_RUN, "--concurrency", "1", name="manager")

    wait_until(lambda: printed(queue, running_id, "started"), 20, "the blocking command started")
    pid = read_pid(job(queue, running_id).history[-1].path / "pid")

    taken = ok("status", queue, "--json").json()
    assert taken["counts"] == {
        "incoming": 0,
        "ready": 1,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 1,
        "done": 0,
        "dead": 0,
    }
    assert taken["oldest_ready_age"] > 0
    [seen] = taken["managers"]
    assert seen["host"] == socket.gethostname()
    assert seen["pid"] == manager.pid
    assert 0 <= seen["heartbeat_age"] < 3
    assert seen["alive"] is True
    [running] = taken["running"]
    assert running["id"] == running_id
    assert running["function"] == COMMAND
    assert running["attempt"] == 1
    assert running["age"] > 0
    assert running["pid"] == pid
    assert isinstance(running["cpu"], float)
    assert running["cpu"] >= 0
    assert running["rss"] > 0

    text = ok("status", queue).out
    assert "managers (1):" in text
    assert f"pid {manager.pid}" in text
    assert "running (1):" in text
    assert running_id in text
    assert f"pid {pid}" in text
    assert "attempt 1/1" in text

    (barriers / "release").touch()
    wait_until(lambda: job(queue, queued_id).state is State.DONE, 20, "both jobs ran")
    assert job(queue, running_id).state is State.DONE
    stop_manager(procs, manager)


def test_status_watch_json_prints_one_document_per_refresh(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    # PYTHONUNBUFFERED pinned: without it the documents are block-buffered (see the next test)
    unbuffered = ["env", "PYTHONUNBUFFERED=1"]
    watcher = procs.forkvisor(
        "status", str(queue), "--watch", "--json", "--interval", "0.1", name="watch", prefix=unbuffered
    )

    def documents() -> list[dict[str, Any]]:
        text = procs.log(watcher)  # stdout and stderr: everything must parse
        return [json.loads(line) for line in text.splitlines()[:-1] if line]  # the last may be half written

    wait_until(lambda: len(documents()) >= 1, 20, "the first status document")
    submit(queue, "true")
    wait_until(lambda: len(documents()) >= 3, 20, "three status documents")
    wait_until(
        lambda: any(doc["counts"]["ready"] == 1 for doc in documents()),
        20,
        "a refresh showed the job submitted meanwhile",
    )
    watcher.send_signal(signal.SIGINT)
    assert procs.wait_exit(watcher, 20, "status --watch after Ctrl-C") == 130, procs.log(watcher)
    for document in documents():
        assert set(document) == {
            "queue",
            "counts",
            "managers",
            "running",
            "oldest_ready_age",
            "unserved",
            "paused",
            "paused_all",
        }
    assert documents()[0]["counts"]["ready"] == 0
    assert "Traceback" not in procs.log(watcher)


def test_status_watch_json_documents_reach_a_pipe_as_they_are_made(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    buffered = ["env", "-u", "PYTHONUNBUFFERED"]  # as in an ordinary shell
    watcher = procs.forkvisor(
        "status", str(queue), "--watch", "--json", "--interval", "0.2", name="watch", prefix=buffered
    )
    try:
        # 3 s is 15 refreshes, about 2.5 KB: less than a buffer, more than enough for a flushed first line
        wait_until(lambda: "\n" in procs.log(watcher), 3, "the first status document reached the log file")
    finally:
        watcher.send_signal(signal.SIGINT)
        assert procs.wait_exit(watcher, 20, "status --watch after Ctrl-C") == 130, procs.log(watcher)


# -- list ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), ["waiting", "later", "one", "two", "echo", "cannot", "failing"]),
        (("--state", "done"), ["one", "two", "echo"]),
        (("--state", "DEAD"), ["cannot", "failing"]),
        (("--function", "sample.ok"), ["one", "two"]),
        (("--function", COMMAND, "--state", "done"), ["echo"]),
        (("--limit", "2"), ["waiting", "later"]),
        (("--limit", "0", "--state", "scheduled"), ["later"]),
    ],
)
def test_list_json_filters(finished: Finished, options: tuple[str, ...], expected: list[str]) -> None:
    listed = ok("list", finished.queue, *options, "--json").json()
    by_id = {getattr(finished, name): name for name in expected}
    assert sorted(entry["id"] for entry in listed) == sorted(by_id), listed
    assert [entry["state"] for entry in listed] == sorted(
        (entry["state"] for entry in listed), key=[s.value for s in State].index
    ), "states in the order ready, scheduled, claimed, done, dead"
    for entry in listed:
        assert {"id", "state", "function", "attempts", "max_attempts", "priority", "created", "error"} <= set(entry)
        assert is_job_id(entry["id"])


def test_list_json_entries(finished: Finished) -> None:
    listed = {entry["id"]: entry for entry in ok("list", finished.queue, "--json").json()}
    assert listed[finished.two]["priority"] == 5
    assert listed[finished.failing]["attempts"] == 2
    assert listed[finished.failing]["max_attempts"] == 2
    assert "exited 3" in listed[finished.failing]["error"]
    assert "nope" in listed[finished.cannot]["error"]
    assert listed[finished.one]["error"] is None
    assert listed[finished.echo]["function"] == COMMAND


def test_list_text_has_one_line_per_job(finished: Finished) -> None:
    lines = ok("list", finished.queue, "--state", "done").lines
    assert len(lines) == 3
    assert {line.split()[0] for line in lines} == {finished.one, finished.two, finished.echo}
    [echo_line] = [line for line in lines if line.startswith(finished.echo)]
    assert "$ echo hello" in echo_line
    assert ok("list", finished.queue, "--state", "claimed").out == ""


# -- show ---------------------------------------------------------------------------


def test_show_json_has_every_run_with_its_outcome_and_the_events(finished: Finished) -> None:
    shown = ok("show", finished.queue, finished.failing, "--json").json()
    assert shown["id"] == finished.failing
    assert shown["state"] == "dead"
    assert shown["attempts"] == 2
    assert shown["spec"]["args"] == ["sh", "-c", FAILING]
    assert shown["error"]["reason"] == "attempts exhausted"
    assert [run["run"] for run in shown["history"]] == [1, 2]
    assert [run["outcome"]["exit_code"] for run in shown["history"]] == [3, 3]
    assert [run["outcome"]["status"] for run in shown["history"]] == ["exited 3", "exited 3"]
    events = shown["events"]
    assert "enqueued" in events[0]
    assert sum("claimed by" in line for line in events) == 2
    assert any("failed: attempt 1/2" in line for line in events)
    assert "dead" in events[-1]

    done = ok("show", finished.queue, finished.one, "--json").json()
    assert done["state"] == "done"
    assert done["result"]["value"] == "one"
    assert done["error"] is None
    [run] = done["history"]
    assert run["outcome"]["succeeded"] is True
    assert run["outcome"]["pid"] == done["result"]["pid"]


def test_show_text(finished: Finished) -> None:
    text = ok("show", finished.queue, finished.failing).out
    assert f"job       {finished.failing}" in text
    assert "state     dead" in text
    assert "command   sh -c " in text
    assert "attempts  2/2" in text
    assert "run 1: exited 3" in text
    assert "run 2: exited 3" in text
    assert "events:" in text
    text = ok("show", finished.queue, finished.two).out
    assert "function  sample.ok" in text
    assert "priority 5" in text
    assert 'result    {"value": "two"' in text


# -- logs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ((), "out 2\n"),
        (("--attempt", "1"), "out 1\n"),
        (("--stderr",), "err 2\n"),
        (("--attempt", "1", "--stderr"), "err 1\n"),
    ],
)
def test_logs_prints_a_runs_stdout_or_stderr(finished: Finished, options: tuple[str, ...], expected: str) -> None:
    assert ok("logs", finished.queue, finished.failing, *options).out == expected


def test_logs_of_a_python_job(finished: Finished) -> None:
    assert ok("logs", finished.queue, finished.one).out == "sample.ok running with 'one'\n"


def test_logs_refuses_a_run_that_does_not_exist(finished: Finished) -> None:
    refused(cli("logs", finished.queue, finished.failing, "--attempt", "3"), 2, "has no run 3")
    refused(cli("logs", finished.queue, finished.waiting), 3, "has not run yet")


def test_logs_follow_prints_lines_written_after_it_started(procs: Processes, tmp_path: Path, barriers: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    script = "echo before; while [ ! -e release ]; do sleep 0.05; done; echo after; echo on-stderr >&2"
    job_id = submit(queue, "sh", "-c", script, cwd=barriers)
    manager = procs.forkvisor("run", str(queue), *FAST_RUN, name="manager")

    wait_until(lambda: printed(queue, job_id, "before"), 20, "the command printed its first line")
    buffered = ["env", "-u", "PYTHONUNBUFFERED"]  # as in an ordinary shell: --follow must flush by itself
    follower = procs.forkvisor("logs", str(queue), job_id, "--follow", name="follow", prefix=buffered)
    wait_until(lambda: "before" in procs.log(follower), 20, "logs --follow printed the first line")
    assert follower.poll() is None, "logs --follow ended while the job still ran"
    (barriers / "release").touch()
    assert procs.wait_exit(follower, 20, "logs --follow after the job ended") == 0
    assert procs.log(follower) == "before\nafter\n"
    assert job(queue, job_id).state is State.DONE
    stop_manager(procs, manager)


def test_list_pages_with_after(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    ids = [enqueue(queue, "sample.ok", "--args", f"[{n}]") for n in range(5)]
    first = json.loads(cli("list", queue, "--state", "ready", "--limit", "3", "--json").out)
    second = json.loads(
        cli("list", queue, "--state", "ready", "--limit", "3", "--json", "--after", first[-1]["entry"]).out
    )
    assert [job["id"] for job in first + second] == ids
    refused(cli("list", queue, "--after", first[-1]["entry"]), 2, "--after pages through one state")
