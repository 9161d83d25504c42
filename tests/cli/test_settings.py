"""`forkvisor init` and `forkvisor config`: a queue's settings, stored in queue.json
and used by the jobs enqueued and the managers started after a change; `drain`."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

from jobs import JobNotFound, State
from tests.cli.conftest import (
    RUN_NO_LEASE,
    burst,
    cli,
    job,
    ok,
    refused,
    spec_file,
    stop_manager,
    submit,
    wait_explained,
)
from tests.processes import Processes, dump, wait_until

DEFAULTS = {
    "max_attempts": 3,
    "timeout": None,
    "memory_limit": None,
    "output_limit": 8 << 20,
    "backoff": "exponential 1s 5m",
    "lease": 30.0,
    "retention": None,
    "root_jobs": False,
}


def marker(queue: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((queue / "queue.json").read_text())
    return data


def test_init_creates_a_queue_and_config_shows_the_defaults(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    created = ok("init", queue)
    assert created.lines == [str(queue)]
    assert marker(queue)["shared"] is False
    assert marker(queue)["defaults"] == {}, "only what someone sets is stored"
    assert stat.S_IMODE(os.stat(queue).st_mode) == 0o700

    shown = ok("config", queue)
    assert shown.lines == [
        "max_attempts  3                  (default)",
        "timeout       none               (default)",
        "memory_limit  none               (default)",
        "output_limit  8M                 (default)",
        "backoff       exponential 1s 5m  (default)",
        "lease         30s                (default)",
        "retention     none               (default)",
        "root_jobs     no                 (default)",
    ]
    assert ok("config", queue, "--json").json() == DEFAULTS
    assert ok("config", queue, "lease", "--json").json() == {"lease": 30.0}
    assert ok("config", queue, "timeout").lines == ["none"]


def test_init_options_are_stored_in_queue_json(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    options = ("--max-attempts", "2", "--timeout", "90s", "--lease", "4", "--retention", "7d")
    options += ("--memory-limit", "1G", "--output-limit", "1M", "--backoff", "fixed 5s")
    ok("init", queue, *options)
    expected = {
        "max_attempts": 2,
        "timeout": 90.0,
        "memory_limit": 1 << 30,
        "output_limit": 1 << 20,
        "backoff": "fixed 5s",
        "lease": 4.0,
        "retention": 7 * 86400.0,
    }
    assert marker(queue)["defaults"] == expected
    assert ok("config", queue, "--json").json() == {**expected, "root_jobs": False}
    shown = [line.split()[1] for line in ok("config", queue).lines]
    assert shown == ["2", "90s", "1G", "1M", "fixed", "4s", "7d", "no"]

    # init on an existing queue changes only the settings it names, and keeps the jobs
    job_id = submit(queue, "true")
    ok("init", queue, "--timeout", "none")
    assert marker(queue)["defaults"] == {key: value for key, value in expected.items() if key != "timeout"}
    assert job(queue, job_id).state is State.READY


def test_config_change_is_stored_and_applies_to_every_job_not_yet_claimed(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    ok("init", queue)
    before = submit(queue, "false", options=())

    assert ok("config", queue, "max_attempts", "2").lines == ["2"]
    assert ok("config", queue, "timeout", "2m", "--json").json() == {"timeout": 120.0}
    assert ok("config", queue, "backoff", "fixed 0.1s").lines == ["fixed 0.1s"]
    assert marker(queue)["defaults"] == {"max_attempts": 2, "timeout": 120.0, "backoff": "fixed 0.1s"}
    assert "max_attempts" not in spec_file(queue, before), "the queue's value is not baked into the job"

    told = submit(queue, "false", options=("--max-attempts", "1", "--timeout", "5"))
    assert spec_file(queue, told)["max_attempts"] == 1
    assert spec_file(queue, told)["timeout"] == 5.0
    burst(queue, app=False)
    assert job(queue, before).attempts == 2, "enqueued before the change, claimed after it"
    assert job(queue, told).attempts == 1, "what the submitter set wins"
    shown = ok("show", queue, before).out
    assert (
        "max_attempts 2 (queue)  timeout 2m (queue)  memory_limit none (default)  output_limit 8M (default)  "
        "backoff fixed 0.1s (queue)" in shown
    )

    ok("config", queue, "timeout", "none")
    ok("config", queue, "backoff", "default")
    assert marker(queue)["defaults"] == {"max_attempts": 2}
    assert ok("config", queue, "backoff").lines == ["exponential 1s 5m"]


def test_a_bad_config_value_changes_nothing(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    ok("init", queue, "--lease", "4")
    stored = (queue / "queue.json").read_bytes()
    refused(cli("config", queue, "lease", "soon"), 2, "not a duration")
    refused(cli("config", queue, "max_attempts", "0"), 2, "max_attempts")
    refused(cli("config", queue, "lease", "none"), 2, "lease")
    refused(cli("config", queue, "colour", "blue"), 2, "not a queue setting")
    assert (queue / "queue.json").read_bytes() == stored


def test_manager_without_options_uses_the_queues_lease_and_retention_and_drain_stops_it(
    procs: Processes, tmp_path: Path
) -> None:
    queue = tmp_path / "queue"
    ok("init", queue, "--lease", "4", "--retention", "1s")
    manager = procs.forkvisor("run", str(queue), *RUN_NO_LEASE, name="manager")  # no --lease, no --retention

    def owner_files() -> list[Path]:
        return list(queue.glob("claimed/*/.owner.json"))

    wait_until(lambda: len(owner_files()) == 1, 20, "the manager registered in claimed/")
    owner = json.loads(owner_files()[0].read_text())
    assert owner["lease"] == 4.0
    assert owner["pid"] == manager.pid

    [seen] = ok("status", queue, "--json").json()["managers"]
    assert seen["lease"] == 4.0
    assert seen["pid"] == manager.pid
    assert seen["host"] == socket.gethostname()
    assert 0 <= seen["heartbeat_age"] < 4

    # retention 1s: the manager's sweeper purges a done job soon after it finishes
    job_id = submit(queue, "true")

    def purged() -> bool:
        try:
            job(queue, job_id)
        except JobNotFound:
            return True
        return False

    def explain() -> str:
        try:
            state = dump(job(queue, job_id))
        except JobNotFound:
            state = "purged just now"
        return f"job: {state}\nmanager's log:\n{procs.log(manager)[-4000:]}"

    wait_explained(purged, 20, "the done job was purged after the queue's 1s retention", explain)
    assert job_id in (queue / "purged.log").read_text()

    drained = ok("drain", queue)
    assert "drain" in drained.out
    assert procs.wait_exit(manager, 20, "manager asked to drain by `forkvisor drain`") == 0, procs.log(manager)
    assert os.listdir(queue / "claimed") == []


def test_manager_lease_option_overrides_the_queues(procs: Processes, tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    ok("init", queue, "--lease", "4")
    manager = procs.forkvisor("run", str(queue), *RUN_NO_LEASE, "--lease", "6", name="manager")
    wait_until(lambda: any(queue.glob("claimed/*/.owner.json")), 20, "the manager registered in claimed/")
    [owner_file] = queue.glob("claimed/*/.owner.json")
    assert json.loads(owner_file.read_text())["lease"] == 6.0
    stop_manager(procs, manager)


def test_shared_queue_runs_command_jobs_only_with_commands(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    ok("init", queue, "--shared", "--lease", "3")
    assert marker(queue)["shared"] is True
    assert stat.S_IMODE(os.stat(queue).st_mode) == 0o2750, "members read it; only the owner writes it"

    job_id = submit(queue, "true", options=("--max-attempts", "3"))
    burst(queue, app=False)
    left = job(queue, job_id)
    assert left.state is State.READY, "a manager of a shared queue does not run commands unless told to"
    assert left.attempts == 0

    burst(queue, "--commands", app=False)
    assert job(queue, job_id).state is State.DONE


def test_init_shared_on_an_existing_private_queue_is_not_silently_ignored(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    ok("init", queue)
    result = cli("init", queue, "--shared")
    assert result.code != 0 or marker(queue)["shared"] is True, f"{result}\nqueue.json: {marker(queue)}"


def test_init_with_a_bad_setting_creates_nothing(tmp_path: Path) -> None:
    queue = tmp_path / "queue"
    refused(cli("init", queue, "--timeout", "later"), 2, "not a duration")
    assert not (queue / "queue.json").exists()
