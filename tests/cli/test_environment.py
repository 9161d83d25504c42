"""`forkvisor run`'s options from FORKVISOR_* variables (issue 19): flag, then
environment, then the queue's settings, then the default."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from jobs import State
from tests.cli.conftest import cli, counts, enqueue, job, new_queue, refused
from tests.processes import APP, REPO


def test_a_manager_takes_its_options_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = new_queue(tmp_path / "queue")
    ids = [enqueue(queue, "sample.ok", "--args", "[1]") for _ in range(3)]
    for name, value in {
        "BURST": "yes",  # without it the manager would serve for ever and the run below time out
        "APP": APP,
        "PATH": f"{tmp_path}{os.pathsep}{REPO}",
        "CONCURRENCY": "1",
        "POLL_INTERVAL": "200ms",
        "KILL_GRACE": "0.5",
    }.items():
        monkeypatch.setenv(f"FORKVISOR_{name}", value)
    result = cli("run", queue, timeout=60)
    assert result.code == 0, result
    assert [job(queue, job_id).state for job_id in ids] == [State.DONE] * 3
    assert "concurrency 1" in result.err, result


def test_a_flag_wins_over_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = new_queue(tmp_path / "queue")
    enqueue(queue, "sample.ok", "--args", "[1]")
    monkeypatch.setenv("FORKVISOR_CONCURRENCY", "not a number")  # never read: the flag says
    monkeypatch.setenv("FORKVISOR_COMMANDS", "yes")
    result = cli("run", queue, "--burst", "--app", APP, "--path", str(REPO), "--concurrency", "2", "--no-commands")
    assert result.code == 0, result
    assert counts(queue)["done"] == 1
    assert "concurrency 2" in result.err, result


def test_a_variable_that_does_not_read_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = new_queue(tmp_path / "queue")
    monkeypatch.setenv("FORKVISOR_DRAIN_TIMEOUT", "soon")
    refused(cli("run", queue, "--burst"), 2, "FORKVISOR_DRAIN_TIMEOUT='soon' in the environment")


def test_several_queues_and_their_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    high, low = new_queue(tmp_path / "high"), new_queue(tmp_path / "low")
    ids = {queue: enqueue(queue, "sample.ok", "--args", "[1]") for queue in (high, low)}
    monkeypatch.setenv("FORKVISOR_QUEUE_CONCURRENCY", f"{low}=1, {high}=2")
    result = cli("run", high, low, "--burst", "--app", APP, "--path", str(REPO), "--concurrency", "3")
    assert result.code == 0, result
    assert all(job(queue, job_id).state is State.DONE for queue, job_id in ids.items())
    for queue, cap in ((high, 2), (low, 1)):
        assert re.search(rf"{re.escape(str(queue))} \(as owner \S+, at most {cap} of its jobs at once\)", result.err)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["high", "high/../high"], "is given twice"),
        (["high", "--queue-concurrency", "low=1"], "which this manager does not serve"),
        (["high", "--queue-concurrency", "high"], "must look like QUEUE=N"),
        (["high", "--queue-concurrency", "high=none"], "is not a whole number"),
    ],
)
def test_bad_queue_lists_are_refused(tmp_path: Path, arguments: list[str], message: str) -> None:
    for name in ("high", "low"):
        new_queue(tmp_path / name)
    refused(cli("run", *arguments, "--burst", cwd=tmp_path), 2, message)


def test_a_services_logging_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    queue = new_queue(tmp_path / "queue")
    enqueue(queue, "sample.ok", "--args", "[1]")
    monkeypatch.setenv("FORKVISOR_LOG_FORMAT", "json")
    monkeypatch.setenv("FORKVISOR_LOG_FILE", str(tmp_path / "manager.log"))
    result = cli("run", queue, "--burst", "--app", APP, "--path", str(REPO))
    assert result.code == 0, result
    assert result.err == "", "the log went to the file"
    lines = [json.loads(line) for line in (tmp_path / "manager.log").read_text().splitlines()]
    assert any(line.get("event") == "succeeded" for line in lines), lines
    monkeypatch.setenv("FORKVISOR_LOG_FORMAT", "xml")
    refused(cli("run", queue, "--burst"), 2, "FORKVISOR_LOG_FORMAT='xml' in the environment")
