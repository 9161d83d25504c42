"""A job's run counter: the `attempts` file in its folder, how many runs it has used.

The one home for it: reading it, counting a run before any of its code runs (guarantee
3), giving a released run back, an operator's reset. What a count means (attempts left
or not) is `jobs.fate`'s to decide. A count is written through the job's place in
`claimed/OWNER/`, never through its handle: if a sweep took the job away meanwhile (its
owner stood still past its lease), the rename finds no place and nothing is counted in
a job that is no longer the writer's (FileNotFoundError). Through the handle, a stale
count would land wherever the job went, over its new owner's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from jobs import files
from jobs.errors import InvalidJob
from jobs.folder import COUNTER_FILE, QueueFolder
from jobs.handles import Dir, Entry


def used(job: Dir) -> int:
    """Runs used so far (a missing file: none). InvalidJob when the file is unreadable or
    not a number: reading it as 0 would hand a crash-looping job a fresh set of attempts."""
    return counted(job) or 0


def counted(job: Dir) -> int | None:
    """`used`, or None when the job has no counter: it was never counted."""
    try:
        text = files.read_limited(COUNTER_FILE, 64, job.fd).decode("ascii", "replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InvalidJob(f"cannot read the attempts counter of {_name(job)}: {exc.strerror or exc}") from None
    if not text.isdigit():
        raise InvalidJob(f"the attempts counter of {_name(job)} holds {text[:20]!r}, not a number")
    return int(text)


def count_run(folder: QueueFolder, place: Entry, job: Dir, already: int, staged: bool = False) -> bool:
    """Count the claimed job's next run (after `already`), before it starts. `staged`, in a
    durable queue: only staged (`stage_run`), for `commit` to put in place. (A plain queue's
    count is as durable as it ever gets at once.) Whether it was only staged."""
    if staged and folder.durable:
        stage_run(folder, place, already)
        return True
    _write_at(folder, place, job, already + 1)
    return False


def stage_run(folder: QueueFolder, place: Entry, already: int) -> None:
    """Write the count of the claimed job's next run (after `already`) beside its counter,
    not yet in place: `commit` puts it there. A durable manager forks the run's child in
    between, which waits at its gate until the count is on disk (guarantee 3: counted
    before any of the job's code runs, not necessarily before the fork)."""
    staged = f"{place.name}/{files.staging_name(COUNTER_FILE)}"
    files.unlink_if_there(staged, place.dir.fd)  # a previous run of this pid died mid-count
    files.write_new(staged, f"{already + 1}\n".encode(), durable=False, mode=folder.file_mode, dir_fd=place.dir.fd)


def commit(places: Sequence[Entry]) -> list[OSError | None]:
    """Put the staged counts of the claimed jobs at `places` in place, the barriers shared
    (group commit): every staged file's data, then every rename; `make_durable` then syncs
    every job folder. On a journaling file system the first fsync of each step commits the
    whole step, and the others find nothing left to write. For each place, None, or why its
    count is not in place (FileNotFoundError: a sweep took the job away; nothing was counted)."""
    staged = files.staging_name(COUNTER_FILE)
    failed = [_each(lambda p: files.fsync_file(f"{p.name}/{staged}", p.dir.fd), place) for place in places]
    files.checkpoint("count:synced")
    for index, place in enumerate(places):
        if failed[index] is None:
            failed[index] = _each(lambda p: _put_in_place(p, staged), place)
    files.checkpoint("count:renamed")
    return failed


def make_durable(places: Sequence[Entry], failed: list[OSError | None]) -> None:
    """The job folders of the counts `commit` put in place (`failed[i]` None), on disk: the
    count's rename, and what was made beside it since (the run folder)."""
    for index, place in enumerate(places):
        if failed[index] is None:
            failed[index] = _each(lambda p: files.fsync_dir(p.name, p.dir.fd), place)


def _put_in_place(place: Entry, staged: str) -> None:
    fd = place.dir.fd
    os.replace(f"{place.name}/{staged}", f"{place.name}/{COUNTER_FILE}", src_dir_fd=fd, dst_dir_fd=fd)


def _each(step: Callable[[Entry], None], place: Entry) -> OSError | None:
    try:
        step(place)
        return None
    except OSError as exc:
        return exc


def give_back(folder: QueueFolder, place: Entry, job: Dir, run: int) -> None:
    """Uncount run `run` of the claimed job: it was released, not used (a drain's stop)."""
    _write_at(folder, place, job, max(0, run - 1))


def reset(folder: QueueFolder, job: Dir) -> None:
    """A fresh set of attempts (an operator's retry of a dead job)."""
    folder.replace_file(job / COUNTER_FILE, b"0\n")


def _write_at(folder: QueueFolder, place: Entry, job: Dir, value: int) -> None:
    try:
        files.replace_file(
            f"{place.name}/{COUNTER_FILE}",
            f"{value}\n".encode(),
            durable=folder.durable,
            mode=folder.file_mode,
            dir_fd=place.dir.fd,
        )
    except FileNotFoundError:
        files.unlink_if_there(files.staging_name(COUNTER_FILE), job.fd)  # ours, wherever the job is now
        raise


def _name(job: Dir) -> str:
    return os.path.basename(os.fspath(job.path))
