"""Structured logs (issue 14): `--log-format json` before or after the command, one
object per line with the run's fields; every format says what happened in the
user's words (cannot be completed, retrying, dead, released), not only an exit status."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.cli.conftest import burst, enqueue, new_queue

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_json_logs_after_the_command_carry_each_runs_fields(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    ok_id = enqueue(queue, "sample.ok", "--args", "[1]")
    cannot_id = enqueue(queue, "sample.cannot", "--args", '["no such customer"]')
    result = burst(queue, "--log-format", "json")
    lines = [json.loads(line) for line in result.err.splitlines()]  # every line is one JSON object
    assert all(ISO_UTC.match(line["time"]) for line in lines), lines[0]
    by_event = {(line.get("event"), line.get("job_id")): line for line in lines}

    started = by_event[("started", ok_id)]
    assert (started["function"], started["attempt"], started["queue"]) == ("sample.ok", 1, str(queue))
    assert started["owner"]
    assert started["pid"] > 0
    succeeded = by_event[("succeeded", ok_id)]
    assert succeeded["exit"] == "exited 0"
    assert succeeded["state"] == "done"
    assert succeeded["duration"] >= 0
    dead = by_event[("dead", cannot_id)]
    assert "cannot be completed" in dead["message"]
    assert "no such customer" in dead["message"]
    assert "failed" not in dead["message"]


def test_text_logs_say_retrying_and_dead_in_words(tmp_path: Path) -> None:
    queue = new_queue(tmp_path / "queue")
    enqueue(queue, "sample.fail", "--args", '["bad input"]')  # max_attempts=2 by registration
    result = burst(queue, "--log-format", "short")
    assert re.search(r"attempt 1/2 failed after \d+\.\d+s \(exited 1: ValueError\); retrying in", result.err), result
    assert re.search(r"attempt 2/2 failed after .*; dead, its 2 attempt\(s\) used up", result.err), result
