"""Unique jobs: at most one live job (incoming, ready, scheduled, waiting or claimed) per key.

A key is a folder of `keys/` (its name: the key, with unsafe characters escaped) holding
numbered generations, each a file naming the job that holds the key:

    keys/report:2026-11-23/0000000001     "20261123-...-ab12cd34\\n"
    keys/report:2026-11-23/0000000002     the next job, once the first was done or dead

The highest generation decides. A submitter reads it: if its job is live (or still being
written under `tmp/`), that job is the key's and the submitter gets its id. Otherwise it
creates the next generation with a hard link that never replaces (`link(2)`, atomic on
NFS too):
of two submitters racing for the same generation exactly one wins, on one host or many,
and the other reads the winner's job. Nothing is ever taken away from a submitter, so
there is no window in which a live key can be removed; older generations are only
removed once a newer one exists, and never matter again.

A submitter that dies between taking the key and publishing its job leaves its job in
`tmp/`, so the key stays taken (the job may yet appear) until a sweep quarantines the
abandoned submission (after the queue's `tmp_age`); then its job is found nowhere and
the key is free. An operator's `retry` of a dead job takes its key again first.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable

from jobs import files
from jobs.errors import JobNotFound, JobsError
from jobs.folder import KEYS, QueueFolder
from jobs.handles import Dir, Entry
from jobs.job import State, check_key, is_job_id

_SAFE = re.compile(r"[A-Za-z0-9_.:@+=,-]")
_GENERATION = re.compile(r"^\d{10}$")
_TRIES = 100
_LONGEST = 200  # characters of a key's folder name
LIVE = (State.INCOMING, State.READY, State.SCHEDULED, State.WAITING, State.CLAIMED)
Locate = Callable[[str], tuple[State, Entry]]  # `view.locate` for one folder: JobNotFound if nowhere


def folder_name(key: str, submitter: int | None = None) -> str:
    """The key's folder in `keys/`: the key, with each character outside [A-Za-z0-9_.:@+=,-]
    (and a leading dot) written as %XX of its UTF-8 bytes; past 200 characters, its first
    160, `~` and 40 hex digits of the key's SHA-256. A member's key (`submitter`: their uid)
    is in the member's own key space: `~UID~` and the rest (no escaped key starts with `~`)."""
    if submitter is not None:
        return f"~{submitter}~{folder_name(key)}"
    escaped = "".join(ch if _SAFE.fullmatch(ch) else "".join(f"%{b:02X}" for b in ch.encode()) for ch in key)
    escaped = "%2E" + escaped[1:] if escaped.startswith(".") else escaped
    if len(escaped) > _LONGEST:  # past a file name's 255 bytes: a readable start and a digest (~ is escaped in keys)
        escaped = f"{escaped[:160]}~{hashlib.sha256(key.encode()).hexdigest()[:40]}"
    return escaped


def reserve(folder: QueueFolder, key: str, job_id: str, locate: Locate, submitter: int | None = None) -> str | None:
    """Take `key` for `job_id` (staged under `tmp/` or about to be taken in); None once it
    is taken, else the id of the live job that holds it. Keys are per submitter: the
    owner's jobs share one key space, each member has their own (`submitter`: their uid),
    so that no member can take a key first and be handed the owner's or another member's
    submissions of it."""
    keys = folder.at(KEYS)
    name = folder_name(check_key(key), submitter)
    for _ in range(_TRIES):
        try:
            with keys.sub(name) as generations:
                holder, top = _top(folder, generations)
                if holder is not None and holder != job_id and is_live(folder, holder, locate):
                    return holder
                if _create(folder, generations, top + 1, job_id):
                    _forget_older(generations, top + 1)
                    return None
        except FileNotFoundError:
            try:
                folder.make_dir(keys / name)
            except FileExistsError:
                pass  # made meanwhile by another submitter
            else:
                if folder.durable:
                    keys.fsync()  # the key's folder outlives a power cut before its job is acknowledged
    raise JobsError(f"could not take key {key!r} after {_TRIES} tries: other submitters keep taking it")


def holder(folder: QueueFolder, key: str, locate: Locate, submitter: int | None = None) -> str | None:
    """The live job that holds `key` in `submitter`'s key space, or None (what a member of
    a shared queue can see)."""
    try:
        with folder.at(KEYS).sub(folder_name(check_key(key), submitter)) as generations:
            found, _ = _top(folder, generations)
    except (FileNotFoundError, JobsError):
        return None
    return found if found is not None and is_live(folder, found, locate) else None


def is_live(folder: QueueFolder, job_id: str, locate: Locate) -> bool:
    """Whether the job may still run: being written under `tmp/`, or in a live state.
    `tmp/` is looked at first: a job leaves it for `ready/` or `scheduled/` and never comes
    back, so one that moves meanwhile is found by `locate`, never missed by both."""
    if folder.tmp.exists(job_id):
        return True
    try:
        state, _ = locate(job_id)
    except JobNotFound:
        return False
    return state in LIVE


def _top(folder: QueueFolder, generations: Dir) -> tuple[str | None, int]:
    """The job named by the highest generation (None if it names none), and its number."""
    numbers = sorted(int(name) for name in generations.names() if _GENERATION.match(name))
    if not numbers:
        return None, 0
    top = numbers[-1]
    try:
        text = files.read_limited(f"{top:010d}", 128, generations.fd).decode("ascii", "replace").strip()
    except OSError:
        return None, top  # unreadable: treated as a job that is gone
    return (text if is_job_id(text) else None), top


def _create(folder: QueueFolder, generations: Dir, number: int, job_id: str) -> bool:
    """Write generation `number` naming `job_id`; False if another submitter wrote it first."""
    data = f"{job_id}\n".encode()
    if not files.link_new(f"{number:010d}", data, durable=folder.durable, mode=folder.file_mode, dir_fd=generations.fd):
        return False
    if folder.durable:
        generations.fsync()
    files.checkpoint("enqueue:key-reserved")
    return True


def _forget_older(generations: Dir, newest: int) -> None:
    """Remove the generations below `newest` (they never decide again)."""
    for name in generations.names():
        if _GENERATION.match(name) and int(name) < newest:
            try:
                os.unlink(name, dir_fd=generations.fd)
            except FileNotFoundError:
                pass  # removed by another submitter
