"""Opening and creating a queue folder: the marker, the state folders, refusals."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs import Queue, QueueError

STATE_FOLDERS = [
    "bells",
    "claimed",
    "dead",
    "done",
    "edges",
    "incoming",
    "keys",
    "quarantine",
    "ready",
    "scheduled",
    "schedules",
    "stats",
    "taken",
    "ticks",
    "tmp",
    "waiting",
]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """Run with the common umask 022, whatever the test runner's is."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_create_makes_the_state_folders_and_the_marker(tmp_path: Path) -> None:
    path = tmp_path / "q"
    queue = Queue(path, create=True)
    assert queue.path == path
    assert sorted(os.listdir(path)) == sorted([*STATE_FOLDERS, "queue.json", ".purge-reserve"])
    assert all((path / name).is_dir() for name in STATE_FOLDERS)
    marker = json.loads((path / "queue.json").read_text())
    assert marker["kind"] == "forkvisor-queue"
    assert marker["version"] == 1
    assert marker["shared"] is False
    assert marker["defaults"] == {}, "only settings someone set are stored"


def test_create_in_an_existing_empty_folder(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.mkdir()
    Queue(path, create=True)
    assert (path / "queue.json").is_file()
    assert (path / "ready").is_dir()


def test_create_makes_missing_parent_folders(tmp_path: Path) -> None:
    queue = Queue(tmp_path / "spool" / "reports", create=True)
    assert (queue.path / "queue.json").is_file()
    assert stat.S_IMODE(os.stat(queue.path).st_mode) == 0o700


def test_create_under_a_file_says_why_it_cannot(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    with pytest.raises(QueueError, match=r"cannot create queue .*plain/q"):
        Queue(tmp_path / "plain" / "q", create=True)


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    queue = Queue("rel", create=True)
    assert queue.path == tmp_path / "rel"
    assert repr(queue) == f"Queue({str(tmp_path / 'rel')!r})"


def test_missing_folder_without_create_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(QueueError, match=r"no such folder") as info:
        Queue(path, create=False)
    assert str(path) in str(info.value)
    assert not path.exists()


def test_empty_folder_without_create_is_refused(tmp_path: Path) -> None:
    with pytest.raises(QueueError, match=r"no queue\.json, so it is not a queue"):
        Queue(tmp_path, create=False)
    assert os.listdir(tmp_path) == []


def test_a_file_is_not_a_queue(tmp_path: Path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(QueueError, match=r"it is not a folder"):
        Queue(path)


def test_non_empty_folder_without_marker_is_refused_naming_what_was_found(tmp_path: Path) -> None:
    path = tmp_path / "photos"
    path.mkdir()
    (path / "holiday.jpg").write_bytes(b"\xff\xd8")
    (path / "album").mkdir()
    with pytest.raises(QueueError) as info:
        Queue(path, create=True)
    message = str(info.value)
    assert "not empty" in message
    assert "album" in message
    assert "holiday.jpg" in message
    assert sorted(os.listdir(path)) == ["album", "holiday.jpg"], "a refused folder must not be written to"


def test_newer_format_version_is_refused(queue_path: Path) -> None:
    Queue(queue_path)
    marker = json.loads((queue_path / "queue.json").read_text())
    marker["version"] = 2
    (queue_path / "queue.json").write_text(json.dumps(marker))
    with pytest.raises(QueueError, match=r"upgrade forkvisor") as info:
        Queue(queue_path)
    assert "version 2" in str(info.value)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b'{"kind": "something-else", "version": 1}', id="other-kind"),
        pytest.param(b'["forkvisor-queue", 1]', id="not-an-object"),
        pytest.param(b'{"version": 1}', id="no-kind"),
    ],
)
def test_marker_of_something_else_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "queue.json").write_bytes(content)
    with pytest.raises(QueueError, match=r"queue\.json does not mark a forkvisor queue"):
        Queue(tmp_path, create=True)
    assert os.listdir(tmp_path) == ["queue.json"], "no state folders are made in a folder that is not a queue"


@pytest.mark.parametrize(
    "content",
    [pytest.param(b"{not json", id="not-json"), pytest.param(b"\xff\xfe", id="not-utf8")],
)
def test_unreadable_marker_is_refused(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "queue.json").write_bytes(content)
    with pytest.raises(QueueError, match=r"queue\.json is unreadable"):
        Queue(tmp_path)


def test_default_permissions_are_private(queue_path: Path, umask_022: None) -> None:
    Queue(queue_path)
    assert _mode(queue_path) == 0o700
    for name in STATE_FOLDERS:
        assert _mode(queue_path / name) == 0o700, name
    assert _mode(queue_path / "queue.json") == 0o600


def test_shared_queue_lets_the_group_read_and_write_only_incoming(queue_path: Path, umask_022: None) -> None:
    """docs/SECURITY.md: members submit into incoming/ (sticky: each removes only their own)
    and read the rest; the owner alone writes the queue folder, queue.json and the job folders."""
    queue = Queue(queue_path, shared=True)
    assert queue.folder.shared is True
    assert _mode(queue_path) == 0o2750
    assert _mode(queue_path / "queue.json") == 0o640
    for name in STATE_FOLDERS:
        assert _mode(queue_path / name) == (0o3773 if name == "incoming" else 0o2750), name
    assert json.loads((queue_path / "queue.json").read_text())["shared"] is True
    assert queue.folder.problems() == []


def test_shared_mode_comes_from_the_marker_not_the_opener(queue_path: Path) -> None:
    Queue(queue_path, shared=True)
    assert Queue(queue_path, shared=False).folder.shared is True
    other = queue_path.parent / "private"
    Queue(other, shared=False)
    assert Queue(other, shared=True).folder.shared is False


def test_shared_queue_job_folders_are_readable_by_the_group_and_writable_by_the_owner_alone(
    queue_path: Path, umask_022: None
) -> None:
    queue = Queue(queue_path, shared=True)
    job_id = queue.enqueue("sample.echo")
    job_dir = queue_path / "ready" / f"100.{job_id}"
    assert _mode(job_dir) == 0o2750
    assert _mode(job_dir / "job.json") == 0o640
    assert _mode(job_dir / "events") == 0o640


def test_a_queue_others_may_write_is_one_no_manager_serves(queue_path: Path) -> None:
    queue = Queue(queue_path, shared=True)
    os.chmod(queue_path, 0o2770)  # a shared queue made by an earlier forkvisor
    os.chmod(queue_path / "queue.json", 0o660)
    os.chmod(queue_path / "ready", 0o2770)
    assert queue.folder.problems() == [
        "the queue folder is writable by its group (mode 2770)",
        "queue.json is writable by its group (mode 0660)",
        "ready/ is writable by its group (mode 2770)",
    ]
    assert sorted(queue.folder.tighten()) == ["queue.json: 0660 -> 0640", "queue: 2770 -> 2750", "ready: 2770 -> 2750"]
    assert queue.folder.problems() == []


def test_missing_parents_are_made_0755_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        Queue(tmp_path / "a" / "b" / "queue")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "a") == _mode(tmp_path / "a" / "b") == 0o755
    assert _mode(tmp_path / "a" / "b" / "queue") == 0o700


def test_two_opens_of_one_queue_see_each_other(queue_path: Path) -> None:
    first = Queue(queue_path)
    marker = (queue_path / "queue.json").read_bytes()
    second = Queue(queue_path, create=False)
    assert (queue_path / "queue.json").read_bytes() == marker, "opening must not rewrite the marker"
    job_id = first.enqueue("sample.echo", 1)
    assert second.job(job_id).spec.args == (1,)
    assert second.counts()["ready"] == 1


def test_reopening_recreates_a_missing_state_folder(queue_path: Path) -> None:
    Queue(queue_path)
    (queue_path / "quarantine").rmdir()
    Queue(queue_path, create=False)
    assert (queue_path / "quarantine").is_dir()


def test_defaults_written_to_the_marker_are_seen_by_a_new_open(queue_path: Path) -> None:
    Queue(queue_path).folder.write_settings({"max_attempts": 7, "timeout": 12.5})
    reopened = Queue(queue_path, create=False)
    assert reopened.folder.settings["max_attempts"] == 7
    assert reopened.folder.settings["timeout"] == 12.5
    assert reopened.folder.stored_settings == {"max_attempts": 7, "timeout": 12.5}
    assert json.loads((queue_path / "queue.json").read_text())["defaults"]["max_attempts"] == 7
