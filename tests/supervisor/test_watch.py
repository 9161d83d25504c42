"""inotify as the manager uses it (supervisor/watch.py): real folders, real events."""

from __future__ import annotations

from pathlib import Path

from supervisor.watch import Watch


def test_a_watched_folder_removed_frees_its_watch(tmp_path: Path) -> None:
    """Once: the watches of members' folders removed since were kept for ever, and past a
    thousand no new member's folder got one (their submissions waited for the poll)."""
    folders = [tmp_path / f"member-{n}" for n in range(3)]
    for folder in folders:
        folder.mkdir()
    watch = Watch(folders)
    try:
        assert watch.watched == 3
        (folders[0] / "job.json").touch()
        folders[1].rmdir()
        events = list(watch.read())
        assert (folders[0], "job.json") in events
        assert watch.watched == 2, "the removed folder's watch is gone"
    finally:
        watch.close()
