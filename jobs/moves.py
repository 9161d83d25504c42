"""Every rename of a job's folder (and of an owner's), with the barriers that make it
durable where the guarantees need it. This is the only module that renames a job
folder (`tests/test_layers.py` says so): what is on disk when can be read here, and
the crash tests find each rename through `files.move`, which every function below
calls once.

Three kinds of move, by what must survive a power cut (`durable`: the queue's setting):

    publish   the target folder is fsynced: the job is there before anyone is told
              (the submitter, a dependent's settler, the index):
              enqueue and take-in (tmp/ -> ready/, scheduled/, waiting/), a schedule's
              tick, settle (waiting/ -> ready/)
    move_on   both folders are fsynced: the job must not come back where it was (a run
              that ended must not be claimed again, a buried job must not be run):
              complete, fail, release, bury, revert (a reaped claim), promote, retry,
              wait (a claimed or retried job whose parents have not ended), purge
              (done/ or dead/ -> tmp/, then removed), an owner's registration
    hand_over none: a claim lost to a power cut is just ready again, its count is what
              is durable (`Claimer`), and a job given back was never changed:
              claim, give back (a function this claimer does not run, a paused one),
              the return of a claim that failed midway

and two renames of other entries: `fence` (a dead owner's folder, renamed so that one
sweeper reaps it; a fence lost to a power cut is simply made again) and `set_aside`
(anything to `quarantine/`).
"""

from __future__ import annotations

import os

from jobs import files
from jobs.handles import Entry


def publish(staging: Entry, target: Entry, durable: bool) -> None:
    """Make a staged job visible at `target`; durable: its folder is on disk before the call
    returns (its content must be already: whoever wrote the staged folder synced it)."""
    _rename(staging, target)
    if durable:
        _fsync_parent(target)


def move_on(place: Entry, target: Entry, durable: bool) -> None:
    """Move a job on from where it was; durable: both folders are on disk before the call returns."""
    _rename(place, target)
    if durable:
        _fsync_parent(target)
        if (place.dir.fd, os.path.dirname(place.name)) != (target.dir.fd, os.path.dirname(target.name)):
            _fsync_parent(place)


def hand_over(place: Entry, target: Entry) -> None:
    """Move a job between a ready folder and a claim, with no barrier (see above)."""
    _rename(place, target)


def fence(owner_folder: Entry, fenced: Entry) -> None:
    """Rename a dead owner's folder before its jobs are reverted: one sweeper wins."""
    _rename(owner_folder, fenced)


def set_aside(entry: Entry, target: Entry) -> None:
    """Move any entry into `quarantine/` (its note says why)."""
    _rename(entry, target)


def _rename(src: Entry, dst: Entry) -> None:
    """One rename(2) that never replaces: MoveCollision if `dst` exists, FileNotFoundError if `src` is gone."""
    files.move(src.name, dst.name, src_dir_fd=src.dir.fd, dst_dir_fd=dst.dir.fd)


def _fsync_parent(entry: Entry) -> None:
    """Make durable the folder holding `entry` (its handle's folder, or a folder below it)."""
    head = os.path.dirname(entry.name)
    if head:
        files.fsync_dir(head, entry.dir.fd)
    else:
        entry.dir.fsync()
