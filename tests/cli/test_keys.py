"""`--key` from the shell: a taken key prints the live job's id (or fails with exit 3);
`show` and `list --json` say a job's key."""

from __future__ import annotations

from pathlib import Path

from jobs import Queue, State
from tests.cli.conftest import cli, ok, refused


def test_submit_with_a_key_twice_makes_one_job(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    first = ok("submit", queue.path, "--key", "nightly", "--", "true").out.strip()
    again = ok("submit", queue.path, "--key", "nightly", "--", "echo", "other").out.strip()
    assert again == first
    assert [job.id for job in queue.jobs(State.READY)] == [first]
    refused(
        cli("submit", queue.path, "--key", "nightly", "--key-taken", "fail", "--", "true"), 3, "held by job " + first
    )
    assert "key       nightly" in ok("show", queue.path, first).out
    assert ok("list", queue.path, "--json").json()[0]["key"] == "nightly"


def test_enqueue_takes_a_key_too(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    args = ("enqueue", queue.path, "sample.ok", "--args", "[1]", "--key", "k")
    assert ok(*args).out == ok(*args).out


def test_a_key_names_one_job(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "q")
    refused(cli("submit", queue.path, "--key", "k", "--stdin", stdin="true\nfalse\n"), 2, "--key names one job")
    refused(cli("submit", queue.path, "--key", "", "--", "true"), 2, "key")
    assert queue.counts()["ready"] == 0
