"""`forkvisor schedule` from the shell: add (a command or a registered function, cron
in a time zone or an interval), list, show, pause, resume, remove, and a clear error
for each bad input, with nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from jobs import COMMAND, Queue
from tests.cli.conftest import cli, ok, refused


def test_add_a_command_schedule_and_read_it_back(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    shown = ok(
        "schedule",
        "add",
        queue.path,
        "nightly",
        "--cron",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--timeout",
        "5m",
        "--priority",
        "5",
        "--",
        "make",
        "report",
    ).out
    assert "30 2 * * * (America/New_York)" in shown
    assert "make report" in shown
    assert "next tick:    20" in shown
    assert "-0500" in shown or "-0400" in shown, "the next tick is shown in the schedule's time zone"
    stored = json.loads((queue.path / "schedules" / "nightly.json").read_text())
    assert stored["job"]["function"] == COMMAND
    assert stored["job"]["args"] == ["make", "report"]
    assert (stored["job"]["timeout"], stored["job"]["priority"]) == (300, 5)
    assert stored["tz"] == "America/New_York"
    (listed,) = [json.loads(line) for line in ok("schedule", "list", queue.path, "--json").lines]
    assert (listed["name"], listed["paused"], listed["last_job"]) == ("nightly", False, None)
    assert "nightly" in ok("schedule", "list", queue.path).out


def test_add_a_function_schedule_with_arguments(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    ok(
        "schedule",
        "add",
        queue.path,
        "sums",
        "--every",
        "5m",
        "--missed",
        "all",
        "--cap",
        "3",
        "--function",
        "sample.add",
        "--args",
        "[1, 2]",
    )
    (info,) = queue.schedules()
    schedule = info.schedule
    assert (schedule.function, schedule.args, schedule.missed, schedule.cap) == ("sample.add", (1, 2), "all", 3)
    assert schedule.timing.every == 300


def test_pause_resume_and_remove(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    ok("schedule", "add", queue.path, "s", "--every", "1h", "--", "true")
    ok("schedule", "pause", queue.path, "s")
    assert queue.schedule("s").paused
    assert "paused" in ok("schedule", "list", queue.path).out
    ok("schedule", "resume", queue.path, "s")
    assert not queue.schedule("s").paused
    ok("schedule", "remove", queue.path, "s")
    assert queue.schedules() == []
    assert os.listdir(queue.path / "schedules") == []


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--cron", "61 * * * *", "--", "true"], 2, "not a cron expression (Bad minute)"),
        (["--cron", "* * * * *", "--tz", "Nowhere/Land", "--", "true"], 2, "time zone 'Nowhere/Land' is unknown"),
        (["--every", "0", "--", "true"], 2, "at least 1s"),
        (["--every", "1m", "--delay", "5s", "--", "true"], 2, "no key, delay, run_at or depends_on"),
        (["--every", "1m", "--key", "k", "--", "true"], 2, "no key, delay, run_at or depends_on"),
        (["--every", "1m"], 2, "nothing to run"),
        (["--every", "1m", "--function", "f", "--", "true"], 2, "not both"),
        (["--cron", "* * * * *", "--every", "1m", "--", "true"], 2, "not allowed with"),
        (["--", "true"], 2, "one of the arguments --cron --every is required"),
    ],
)
def test_a_bad_schedule_is_refused_and_nothing_is_written(
    tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    queue = Queue(tmp_path / "q")
    refused(cli("schedule", "add", queue.path, "s", *args), code, says)
    assert os.listdir(queue.path / "schedules") == []


def test_names_and_duplicates(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    refused(cli("schedule", "add", queue.path, "../etc", "--every", "1m", "--", "true"), 2, "is not a name")
    ok("schedule", "add", queue.path, "s", "--every", "1m", "--", "true")
    refused(cli("schedule", "add", queue.path, "s", "--every", "2m", "--", "true"), 3, "exists")
    ok("schedule", "add", queue.path, "s", "--every", "2m", "--replace", "--", "true")
    assert queue.schedule("s").schedule.timing.every == 120
    for action in ("show", "pause", "resume", "remove"):
        refused(cli("schedule", action, queue.path, "nope"), 3, "no schedule 'nope'")


def test_a_broken_schedule_file_is_left_out_of_the_list_and_show_says_why(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    ok("schedule", "add", queue.path, "good", "--every", "1m", "--", "true")
    (queue.path / "schedules" / "bad.json").write_text('{"name": "bad", "when": "every 1m"}')
    assert [
        row["name"] for row in [json.loads(line) for line in ok("schedule", "list", queue.path, "--json").lines]
    ] == ["good"]
    refused(cli("schedule", "show", queue.path, "bad"), 2, '"job"')
