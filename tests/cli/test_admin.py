"""The commands that act on jobs: `retry`, `cancel`, `purge`, and `wait` (exit statuses,
ids from stdin, --json, --timeout)."""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from jobs import State
from tests.cli.conftest import (
    FAST_RUN,
    RUN_NO_LEASE,
    UNKNOWN_ID,
    burst,
    cli,
    counts,
    enqueue,
    job,
    new_queue,
    ok,
    refused,
    stop_manager,
    submit,
)
from tests.processes import Processes, dump, forkvisor_command, is_gone, outcome, read_pid, wait_until

# -- retry ----------------------------------------------------------------------------


def test_retry_sends_a_dead_job_back_with_fresh_attempts(tmp_path: Path, barriers: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    job_id = submit(queue, "test", "-e", "fixed", cwd=barriers)  # fails until the file exists
    burst(queue, app=False)
    assert job(queue, job_id).state is State.DEAD

    (barriers / "fixed").touch()
    retried = ok("retry", queue, job_id)
    assert retried.lines == [f"{job_id} ready again, attempts reset"]
    found = job(queue, job_id)
    assert found.state is State.READY, dump(found)
    assert found.attempts == 0
    assert found.error is None

    burst(queue, app=False)
    found = job(queue, job_id)
    assert found.state is State.DONE, dump(found)
    assert [attempt.number for attempt in found.history] == [1, 2]
    assert "retried by an operator" in (found.path / "events").read_text()

    refused(cli("retry", queue, job_id), 3, "only dead jobs can be retried")


def test_retry_dead_selects_every_dead_job_or_those_of_one_function(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    cannot = [enqueue(queue, "sample.cannot", "--args", f'["{n}"]') for n in range(2)]
    command = submit(queue, "true")
    alive = enqueue(queue, "sample.ok")
    ok("cancel", queue, *cannot, command)  # three dead jobs, no manager needed
    assert counts(queue)["dead"] == 3

    retried = ok("retry", queue, "--dead", "--function", "sample.cannot")
    assert sorted(line.split()[0] for line in retried.lines) == sorted(cannot)
    assert [job(queue, i).state for i in cannot] == [State.READY] * 2
    assert job(queue, command).state is State.DEAD

    retried = ok("retry", queue, "--dead")
    assert [line.split()[0] for line in retried.lines] == [command]
    assert counts(queue) == {
        "incoming": 0,
        "ready": 4,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 0,
        "dead": 0,
    }
    assert job(queue, alive).state is State.READY
    assert ok("retry", queue, "--dead").out == "", "nothing dead: nothing to say"


def test_retry_reports_each_failure_and_goes_on(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    ready = submit(queue, "true")
    dead = submit(queue, "true")
    ok("cancel", queue, dead)
    result = cli("retry", queue, ready, UNKNOWN_ID, dead)
    assert result.code == 3, result
    assert result.lines == [f"{dead} ready again, attempts reset"]
    errors = result.err.splitlines()
    assert len(errors) == 2, result
    assert all(line.startswith("forkvisor") for line in errors), result
    assert job(queue, dead).state is State.READY


# -- cancel ---------------------------------------------------------------------------


def test_a_running_job_is_stopped_within_a_second_of_its_cancel(procs: Processes, tmp_path: Path) -> None:
    """The cancel touches the job's folder, and its manager watches its owner folder: the
    job gets its SIGTERM at once, not at the next heartbeat (a third of the lease: 20 s here;
    it once took 9.3 s with the default lease)."""
    queue = new_queue(tmp_path / "queue")
    script = 'trap "echo > stopped; exit 1" TERM; echo > started; while :; do sleep 0.02; done'
    job_id = submit(queue, "sh", "-c", script, cwd=tmp_path)
    manager = procs.forkvisor("run", str(queue), *RUN_NO_LEASE, "--lease", "60", name="manager")
    wait_until(lambda: (tmp_path / "started").exists(), 20, "the job started")
    ok("cancel", queue, job_id)
    cancelled = time.monotonic()
    wait_until(lambda: (tmp_path / "stopped").exists(), 20, "the job got its SIGTERM")
    assert time.monotonic() - cancelled < 1.0, "the job was stopped at a heartbeat, not at its cancel"
    assert cli("wait", queue, job_id, "--timeout", "20").code == 1  # dead
    stop_manager(procs, manager)


def test_cancel_buries_a_ready_job_and_stops_a_running_one(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    running_id = submit(
        queue, "sh", "-c", "echo $$ > pid.tmp && mv pid.tmp pid-of-sleeper; exec sleep 60", cwd=tmp_path
    )
    queued_id = submit(queue, "true")
    scheduled_id = submit(queue, "true", options=("--delay", "1h"))
    manager = procs.forkvisor("run", str(queue), *FAST_RUN, "--concurrency", "1", name="manager")
    wait_until(lambda: (tmp_path / "pid-of-sleeper").exists(), 20, "the long command started")
    sleeper = read_pid(tmp_path / "pid-of-sleeper")
    assert job(queue, queued_id).state is State.READY, "concurrency 1: the second job waits"

    cancelled = ok("cancel", queue, queued_id, scheduled_id, running_id)
    assert cancelled.lines == [
        f"{queued_id} cancelled: moved to dead/",
        f"{scheduled_id} cancelled: moved to dead/",
        f"{running_id} running: its manager stops it and moves it to dead/",
    ]
    for job_id in (queued_id, scheduled_id):
        found = job(queue, job_id)
        assert found.state is State.DEAD, dump(found)
        assert found.attempts == 0
        assert not found.history
        assert found.error is not None
        assert found.error["reason"] == "cancelled"

    waited = cli("wait", queue, running_id, "--timeout", "20")
    assert waited.code == 1, waited  # it ended dead
    found = job(queue, running_id)
    assert found.state is State.DEAD, dump(found)
    assert found.error is not None
    assert found.error["reason"] == "cancelled"
    assert outcome(found)["limit"] == "cancelled"
    assert outcome(found)["signal"] == "SIGTERM"
    wait_until(lambda: is_gone(sleeper), 10, "the cancelled command was gone")
    assert found.attempts == 1, "a cancelled job does not run again"

    refused(cli("cancel", queue, running_id), 3, "already dead")
    stop_manager(procs, manager)


# -- purge ----------------------------------------------------------------------------


def test_purge_deletes_finished_jobs_older_than_a_duration(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    old, recent = submit(queue, "true"), submit(queue, "true")
    dead = submit(queue, "true")
    ok("cancel", queue, dead)
    burst(queue, app=False)
    two_hours_ago = time.time() - 7200
    os.utime(job(queue, old).path / "events", (two_hours_ago, two_hours_ago))  # its last transition

    dry = ok("purge", queue, "--state", "done", "--older-than", "1h", "--dry-run", "--json").json()
    assert dry == {"purged": [], "would_purge": [old]}
    assert job(queue, old).state is State.DONE, "a dry run deletes nothing"
    dry_text = ok("purge", queue, "--state", "done", "--older-than", "1h", "--dry-run").lines
    assert dry_text == ["would purge 1 done job(s) older than 1h", old]

    assert ok("purge", queue, "--state", "done", "--older-than", "1h", "--json").json() == {
        "purged": [old],
        "would_purge": [],
    }
    refused(cli("show", queue, old), 3, "no job")
    assert old in (queue / "purged.log").read_text()
    assert job(queue, recent).state is State.DONE
    assert job(queue, dead).state is State.DEAD, "--state done leaves dead jobs"

    assert ok("purge", queue, "--state", "dead", "--older-than", "0").lines == ["purged 1 dead job(s) older than 0s"]
    assert counts(queue) == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 1,
        "dead": 0,
    }


# -- wait -----------------------------------------------------------------------------


def test_wait_exit_status_says_whether_any_job_ended_dead(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    good, bad = submit(queue, "true"), submit(queue, "false")
    # started before any manager: they must wait for the jobs to finish
    waits = {
        "good": procs.forkvisor("wait", str(queue), good, name="wait-good"),
        "both": procs.forkvisor("wait", str(queue), good, bad, name="wait-both"),
        "json": procs.forkvisor("wait", str(queue), good, bad, "--json", name="wait-json"),
        "all": procs.forkvisor("wait", str(queue), name="wait-all"),
    }
    for name, process in waits.items():
        wait_until(functools.partial(polling, process.pid), 20, f"forkvisor wait ({name}) polled its jobs")
    burst(queue, app=False)

    codes = {name: procs.wait_exit(process, 20, f"forkvisor wait ({name})") for name, process in waits.items()}
    assert codes == {"good": 0, "both": 1, "json": 1, "all": 1}
    assert procs.log(waits["good"]) == "", "piped: no progress, no output"
    assert procs.log(waits["both"]) == ""
    assert procs.log(waits["all"]) == ""
    [document] = procs.log(waits["json"]).splitlines()
    assert json.loads(document) == {good: "done", bad: "dead"}

    assert ok("wait", queue, good, "--json").json() == {good: "done"}
    assert ok("wait", queue).out == "", "nothing unfinished: returns at once"


def test_wait_timeout_exits_124(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    job_id = submit(queue, "true")
    started = time.monotonic()
    refused(cli("wait", queue, job_id, "--timeout", "0.3"), 124, "not finished")
    refused(cli("wait", queue, "--timeout", "300ms", "--json"), 124, job_id)
    assert time.monotonic() - started < 10
    assert job(queue, job_id).state is State.READY


def test_submit_stdin_piped_into_wait(procs: Processes, tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    manager = procs.forkvisor("run", str(queue), *FAST_RUN, name="manager")
    forkvisor = shlex.join(forkvisor_command())
    for commands, expected in (("true\necho 'a b'\n", 0), ("true\n# skipped\nsh -c 'exit 5'\n", 1)):
        pipeline = (
            f"{forkvisor} submit {shlex.quote(str(queue))} --stdin --max-attempts 1"
            f" | {forkvisor} wait {shlex.quote(str(queue))} - --timeout 20"
        )
        result = _shell(pipeline, commands)
        assert result[0] == expected, result
        assert result[1:] == ("", ""), result
    assert counts(queue) == {
        "incoming": 0,
        "ready": 0,
        "scheduled": 0,
        "waiting": 0,
        "claimed": 0,
        "done": 3,
        "dead": 1,
    }

    ids = [submit(queue, "true"), submit(queue, "false")]
    waited = cli("wait", queue, "-", "--json", stdin="".join(f"{i}\n" for i in ids) + "\n")
    assert waited.code == 1, waited
    assert waited.json() == {ids[0]: "done", ids[1]: "dead"}
    stop_manager(procs, manager)


SLEEP_SYSCALLS = {"x86_64": {35, 230}, "aarch64": {101, 115}}  # nanosleep, clock_nanosleep


def polling(pid: int) -> bool:
    """True once `pid` sleeps in nanosleep: a `forkvisor wait` that has listed its jobs and polls
    (before that it only imports and reads the queue). Fails the test if `pid` has exited."""
    numbers = SLEEP_SYSCALLS.get(platform.machine())
    if numbers is None:
        pytest.skip(f"no nanosleep syscall numbers for {platform.machine()}")
    try:
        words = Path(f"/proc/{pid}/syscall").read_text().split()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except PermissionError:
        pytest.skip("cannot read /proc/PID/syscall here")
    assert state != "Z", f"pid {pid} exited before any job ran"
    return bool(words) and words[0].isdigit() and int(words[0]) in numbers


def _shell(pipeline: str, stdin: str) -> tuple[int, str, str]:
    done = subprocess.run(["sh", "-c", pipeline], input=stdin, capture_output=True, text=True, timeout=30, check=False)
    return done.returncode, done.stdout, done.stderr
