"""Submissions of those who do not own a queue (members of a shared queue), taken in by
the queue's managers (docs/SECURITY.md has why; docs/FORMAT.md the format).

A member may write only `incoming/`, which is sticky. To submit, they write the job's
`job.json` there as one file, `.ID.json.PID.tmp`, and publish it with one rename to
`ID.json` (a delayed job says when in `"run_at"`). A manager takes it in:

    incoming/ID.json -> incoming/.taking.ID.json      one manager wins the rename
    write tmp/ID/ as the owner's job folder            job.json gains "submitted_by": the
                                                       uid owning the file, which no member forges
    tmp/ID -> ready/RRR.ID (or scheduled/DUE.RRR.ID)  published as any job
    unlink incoming/.taking.ID.json

A take-in that a crash interrupted leaves `.taking.ID.json`: a later one finishes it
(the job is published already: the file goes; it is not: it is taken in again).

A member acts on their own jobs the same way: `incoming/ID.cancel` or `incoming/ID.retry`
asks the managers to cancel or retry job ID. They do it if the request's owner
submitted the job (or owns the queue, or is root), and quarantine the request with
the reason otherwise.
"""

from __future__ import annotations

import heapq
import logging
import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from jobs import document, fate, files, keys
from jobs.config import TMP_AGE
from jobs.errors import InternalError, InvalidJob, JobNotFound, JobsError, MoveCollision, WrongState
from jobs.fate import Cause
from jobs.folder import SPEC_FILE, QueueFolder
from jobs.handles import Entry
from jobs.job import (
    LATEST_DUE,
    MAX_SPEC_BYTES,
    JobSpec,
    State,
    created_at,
    ready_name,
    scheduled_name,
    spec_json,
)

log = logging.getLogger(__name__)

TAKING = ".taking."
_JOB_RE = re.compile(r"^(\d{8}-\d{6}-\d{6}-[0-9a-f]{8})\.json$")
_REQUEST_RE = re.compile(r"^(\d{8}-\d{6}-\d{6}-[0-9a-f]{8})\.(cancel|retry)$")
FRESH_FOR = 3600.0  # a submitted id's time must be this close to the file's: no reuse of an old job's id
STALE_TAKING = 60.0  # a take-in left this long was interrupted


# -- the member's side -----------------------------------------------------------------------


def submit(folder: QueueFolder, job_id: str, data: bytes, *, durable: bool) -> None:
    """Publish one job's `job.json` as a file in `incoming/` for a manager to take in."""
    incoming = folder.at(State.INCOMING)
    staging = f".{job_id}.json.{os.getpid()}.tmp"
    files.unlink_if_there(staging, incoming.fd)
    try:
        # Readable by the queue's group: the owner's managers must read it (the umask may narrow it).
        files.write_new(staging, data, durable=durable, mode=0o640, dir_fd=incoming.fd)
        files.move(staging, f"{job_id}.json", src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
    except BaseException:
        files.unlink_if_there(staging, incoming.fd)
        raise
    if durable:
        incoming.fsync()


def request(folder: QueueFolder, job_id: str, action: str, why: str) -> None:
    """Ask the queue's managers to `cancel` or `retry` job ID (see the module docstring)."""
    incoming = folder.at(State.INCOMING)
    staging = f".{job_id}.{action}.{os.getpid()}.tmp"
    files.unlink_if_there(staging, incoming.fd)
    files.write_new(staging, f"{why}\n".encode(), durable=False, mode=0o640, dir_fd=incoming.fd)
    try:
        files.move(staging, f"{job_id}.{action}", src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
    except MoveCollision:
        files.unlink_if_there(staging, incoming.fd)  # asked already


# -- the managers' side ------------------------------------------------------------------------


@dataclass
class Actions:
    """What the store does for the take-in, given by the caller."""

    cancel: Callable[[str], Any]  # an operator's cancel of job ID
    retry: Callable[[str], Any]  # an operator's retry of job ID
    locate: Callable[[str], tuple[State, Entry]]  # where job ID is; JobNotFound if it is nowhere
    on_ready: Callable[[str], None]  # a name put in ready/
    publish_waiting: Callable[[Entry, str, JobSpec], None]  # a job with depends_on, staged (`jobs.depends`)


def take_in(folder: QueueFolder, now: float, actions: Actions, budget: int = 64, leftovers: bool = False) -> int:
    """Take in up to `budget` submissions and requests of `incoming/`, oldest id first; with
    `leftovers` (the sweeper's), also finish interrupted take-ins and drop abandoned staging
    files. Return how many entries were handled. One entry never stops the others: what is
    not a submission is quarantined. (Members' staging files never slow a manager's turn:
    they are set aside by name, not looked at.)"""
    names = folder.at(State.INCOMING).names()
    picked = heapq.nsmallest(budget, (name for name in names if not name.startswith(".")))
    if leftovers:
        picked += [name for name in names if name.startswith(".")][:budget]
    handled = 0
    for name in picked:
        try:
            handled += _take_entry(folder, name, now, actions)
        except (OSError, JobsError) as exc:  # this entry, not the queue: go on with the next
            log.warning("cannot take in incoming/%r: %s", name, exc)
            handled += 1
    return handled


def _take_entry(folder: QueueFolder, name: str, now: float, actions: Actions) -> bool:
    incoming = folder.at(State.INCOMING)
    if name.startswith(TAKING):
        return _finish_interrupted(folder, name, now, actions)
    if name.startswith("."):
        return _drop_abandoned(folder, name, now)
    if (job := _JOB_RE.match(name)) is not None:
        taking = f"{TAKING}{name}"
        try:
            submitted = incoming.lstat(name).st_ctime  # its publication, before our rename renews it
            files.move(name, taking, src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
        except (FileNotFoundError, MoveCollision):
            return False  # another manager took it
        _take_job(folder, job[1], taking, submitted, now, actions)
        return True
    if (asked := _REQUEST_RE.match(name)) is not None:
        _take_request(folder, name, asked[1], asked[2], now, actions)
        return True
    folder.quarantine(incoming / name, "not a submission: incoming/ holds ID.json, ID.cancel and ID.retry", now)
    return True


def _take_job(folder: QueueFolder, job_id: str, taking: str, submitted: float, now: float, actions: Actions) -> None:
    incoming = folder.at(State.INCOMING)
    try:
        data, status = files.read_regular(taking, MAX_SPEC_BYTES, incoming.fd)
    except OSError as exc:
        folder.quarantine(incoming / taking, f"submission {job_id} cannot be read: {exc.strerror or exc}", now)
        return
    problem = _id_problem(folder, job_id, submitted)
    if problem:
        folder.quarantine(incoming / taking, problem, now)
        return
    checked = _checked(data, job_id, status.st_uid)
    staging = folder.tmp / job_id
    files.remove_quietly(staging.name, dir_fd=staging.dir.fd)  # ours, left by an interrupted take-in
    folder.make_dir(staging)
    created = checked.spec.created if checked.spec is not None and checked.spec.created else created_at(job_id)
    with staging.open() as job:
        folder.log_event(job, "enqueued", created)
        folder.log_event(job, f"taken in from incoming/, submitted by {_user(status.st_uid)}", now)
        folder.write_new(job / SPEC_FILE, spec_json(checked.fields) if checked.fields is not None else data)
    cause = checked.cause or _key_taken(folder, job_id, checked, actions)
    try:
        if cause is not None:
            folder.bury(staging, job_id, cause, now)  # straight to dead/, saying what to fix (or who holds its key)
        else:
            _publish(folder, staging, job_id, checked, actions)
    except MoveCollision:  # a job of this id is there already: this one must not stand beside it
        files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
        folder.quarantine(incoming / taking, f"job {job_id} exists already", now)
        return
    files.unlink_if_there(taking, incoming.fd)


def _key_taken(folder: QueueFolder, job_id: str, checked: _Checked, actions: Actions) -> Cause | None:
    """Take the submission's key (it is staged: it counts as live); why it is dead if a live
    job held the key first (the member's own check, before submitting, lost a race)."""
    key = checked.spec.key if checked.spec is not None else None
    holder = None if key is None else keys.reserve(folder, key, job_id, actions.locate)
    return None if holder is None or key is None else fate.duplicate(key, holder)


def _publish(folder: QueueFolder, staging: Entry, job_id: str, checked: _Checked, actions: Actions) -> None:
    spec, fields = checked.spec, checked.fields
    if spec is None or fields is None:
        raise InternalError(f"job {job_id} was taken in without a spec: a bug in forkvisor")
    due = fields.get("run_at")
    if spec.depends_on:
        actions.publish_waiting(staging, job_id, spec)
    elif isinstance(due, int | float) and not isinstance(due, bool) and due > 0:
        target = folder.at(State.SCHEDULED) / scheduled_name(job_id, spec.priority, min(due, LATEST_DUE))
        folder.move(staging, target)
    else:
        target = folder.at(State.READY) / ready_name(job_id, spec.priority)
        folder.move(staging, target)
        actions.on_ready(target.name)


@dataclass(frozen=True)
class _Checked:
    """A submission, checked: its spec and the job.json the owner writes for it, or why it is dead."""

    spec: JobSpec | None = None
    fields: dict[str, Any] | None = None
    cause: Cause | None = None


def _checked(data: bytes, job_id: str, uid: int) -> _Checked:
    try:
        spec = JobSpec.from_json(data, job_id)
        fields = dict(document.parse(data, SPEC_FILE))
    except InvalidJob as exc:
        return _Checked(cause=fate.invalid(str(exc)))
    # Who submitted it comes from the file's owner, never from its text.
    fields.update(id=job_id, submitted_by={"uid": uid, "user": _user(uid)})
    return _Checked(replace(spec, submitted_by=uid), fields)


def _id_problem(folder: QueueFolder, job_id: str, published: float) -> str | None:
    """Why a submitted id may not be taken in: a job of that id exists, or the id is not
    fresh (a member must not reuse an old job's id to stand beside it)."""
    if abs(created_at(job_id) - published) > FRESH_FOR:
        return f"its id {job_id} was not made when it was submitted (make a fresh one: docs/FORMAT.md)"
    for state in (State.DONE, State.DEAD):
        if folder.at(state).exists(job_id):
            return f"job {job_id} exists already (in {state.value}/)"
    return None


def _take_request(folder: QueueFolder, name: str, job_id: str, action: str, now: float, actions: Actions) -> None:
    incoming = folder.at(State.INCOMING)
    taking = f"{TAKING}{name}"
    try:
        files.move(name, taking, src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)
    except (FileNotFoundError, MoveCollision):
        return  # another manager took it
    requester = incoming.lstat(taking).st_uid
    refusal = _refusal(folder, job_id, requester, actions)
    if refusal is None:
        try:
            (actions.cancel if action == "cancel" else actions.retry)(job_id)
            log.info("%s of job %s asked by %s: done", action, job_id, _user(requester))
        except (JobNotFound, WrongState) as exc:
            refusal = str(exc)
    if refusal is not None:
        why = f"{action} of job {job_id} by {_user(requester)} refused: {refusal}"
        folder.quarantine(incoming / taking, why, now)
    else:
        files.unlink_if_there(taking, incoming.fd)


def _refusal(folder: QueueFolder, job_id: str, requester: int, actions: Actions) -> str | None:
    """Why `requester` may not act on job ID, or None: the job's submitter may, so may the
    queue's owner and root."""
    if requester in (0, os.fstat(folder.root.fd).st_uid):
        return None
    try:
        state, place = actions.locate(job_id)
    except JobNotFound as exc:
        return str(exc)
    # Not taken in yet: its submitter owns the file; taken in: the owner recorded who.
    submitter = place.lstat().st_uid if state is State.INCOMING else submitted_by(place)
    if submitter is None:
        return "it was not submitted through incoming/, so it is the owner's"
    if submitter != requester:
        return f"it was submitted by {_user(submitter)}"
    return None


def submitted_by(place: Entry) -> int | None:
    """The uid the job at `place` was submitted by, as recorded when it was taken in; None
    if it was not (the owner's own job)."""
    try:
        with place.open() as job:
            fields = document.read(SPEC_FILE, MAX_SPEC_BYTES, SPEC_FILE, job.fd)
    except (JobsError, OSError):
        return None
    by = fields.get("submitted_by") if isinstance(fields, dict) else None
    uid = by.get("uid") if isinstance(by, dict) else None
    return uid if isinstance(uid, int) and not isinstance(uid, bool) else None


def _finish_interrupted(folder: QueueFolder, name: str, now: float, actions: Actions) -> bool:
    """A take-in that stopped half way (its manager died): finish it once it is stale."""
    incoming = folder.at(State.INCOMING)
    try:
        changed = incoming.lstat(name).st_ctime
    except FileNotFoundError:
        return False
    if now - changed < STALE_TAKING:
        return False
    original = name[len(TAKING) :]
    job = _JOB_RE.match(original) or _REQUEST_RE.match(original)
    if job is None:
        folder.quarantine(incoming / name, "not a submission", now)
        return True
    try:
        state, _ = actions.locate(job[1])
    except JobNotFound:
        state = State.INCOMING
    # Published means in a state folder; the file being finished is itself "incoming".
    published = _JOB_RE.match(original) is not None and state is not State.INCOMING
    if published:
        files.unlink_if_there(name, incoming.fd)  # taken in already; its manager died before this
    else:
        try:
            files.move(name, original, src_dir_fd=incoming.fd, dst_dir_fd=incoming.fd)  # take it in again
        except MoveCollision:
            folder.quarantine(incoming / name, f"{original} was submitted twice", now)
    return True


def _drop_abandoned(folder: QueueFolder, name: str, now: float) -> bool:
    """A member's staging file whose writer died: remove it once it is old."""
    incoming = folder.at(State.INCOMING)
    try:
        status = incoming.lstat(name)
    except FileNotFoundError:
        return False
    if now - status.st_mtime < TMP_AGE:
        return False
    files.unlink_if_there(name, incoming.fd)  # the owner of a sticky folder may
    return True


def entry_id(name: str) -> str | None:
    """The job id an entry of `incoming/` submits (`ID.json`, or one being taken in), or None."""
    if name.startswith(TAKING):
        name = name[len(TAKING) :]
    found = _JOB_RE.match(name)
    return found[1] if found else None


def read_spec(place: Entry, job_id: str) -> JobSpec:
    """The spec a submission file holds (for readers: `show` of a job not taken in yet)."""
    return JobSpec.from_json(files.read_limited(place.name, MAX_SPEC_BYTES, place.dir.fd), job_id)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


__all__ = ["Actions", "entry_id", "read_spec", "request", "submit", "submitted_by", "take_in"]
