"""Submitting jobs: check the call, write the job under `tmp/`, publish it with
one rename into `ready/` or `scheduled/`.

Until that rename, no manager can see the job, so a half-written job never
runs; a submitter that dies before it leaves an entry in `tmp/`, which a sweep
quarantines. Specs are checked and encoded once, before anything is written.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from jobs import depends, files, incoming, keys, moves, view
from jobs.document import MAX_DEPTH
from jobs.document import too_deep as document_too_deep
from jobs.errors import ArgumentNotSerializable, InvalidJob, KeyTaken, storage_error
from jobs.folder import SPEC_FILE, QueueFolder
from jobs.handles import Entry
from jobs.job import (
    LATEST_DUE,
    SPEC_FORMAT,
    JobOptions,
    State,
    new_job_id,
    ready_name,
    scheduled_name,
    spec_json,
)
from jobs.registry import Registered, default_name, registration_of
from jobs.units import format_duration


@dataclass(frozen=True)
class Call:
    """One job of a batch for `enqueue_many`."""

    fn: Callable[..., Any] | str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: JobOptions | None = None


@dataclass(frozen=True)
class _Submission:
    """A checked job on its way to disk: its id and priority, its encoded spec, its due time."""

    id: str
    priority: int
    data: bytes
    due: float | None
    key: str | None = None
    if_key_taken: str = "return"
    depends_on: tuple[str, ...] = ()


_NO_OPTIONS = JobOptions()  # checked once, not per call


class Publisher:
    """Writes and publishes jobs into one queue folder."""

    def __init__(self, folder: QueueFolder, on_ready: Callable[[str], None]) -> None:
        self._folder = folder
        self._on_ready = on_ready
        # Who does not own the queue (a member of a shared one) may write incoming/ only.
        self._via_incoming = not folder.owned()
        self._locate = functools.partial(view.locate, folder)  # where a key's job is

    def submit(self, call: Call, now: float) -> str:
        """`Queue.submit`: built and checked, staged under `tmp/`, its key taken, then published."""
        job = self._build(call, now)
        if job.depends_on:  # a typo would wait for ever
            depends.check_parents(self._folder, job.id, job.depends_on)
        if self._via_incoming:
            mine = os.geteuid()  # a member's keys are in their own key space (`jobs.keys`)
            if job.key is not None and (held := keys.holder(self._folder, job.key, self._locate, mine)) is not None:
                return _taken(job, held)  # (a managers' take-in checks the key again: see jobs.incoming)
            return self._submit_incoming(call, now)
        staging = self._stage(job, now, sync=self._folder.durable)
        if job.key is not None and (held := self._reserve(job, job.key, staging)) is not None:
            return _taken(job, held)
        if job.depends_on:
            self.publish_waiting(staging, job.id, job.depends_on, now)
        else:
            self._publish(staging, job, sync=self._folder.durable)
        return job.id

    def publish_waiting(self, staging: Entry, job_id: str, parents: tuple[str, ...], now: float) -> None:
        """Publish a staged job that depends on `parents`: its edges, then waiting/, then a
        look at its parents (any that ended meanwhile release it now)."""
        try:
            depends.write_edges(self._folder, job_id, parents)
            files.checkpoint("enqueue:edges-written")
            depends.publish_waiting(self._folder, staging, job_id)
        except OSError as exc:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            raise storage_error(exc, "enqueue into", self._folder.path) from exc
        files.checkpoint("enqueue:waiting")
        depends.settle(self._folder, job_id, now, self._on_ready)

    def submit_once(self, call: Call, now: float, job_id: str, take: Callable[[], bool]) -> bool:
        """Publish `call` as the job `job_id` if `take()`, called while the job is staged,
        says it is this writer's: a schedule's tick (`jobs.ticks`). False if another writer
        is staging the same id or took it first."""
        job = self._build(call, now, job_id)
        try:
            staging = self._stage(job, now, sync=self._folder.durable)
        except FileExistsError:
            return False  # another firer of the same tick is at work: it is theirs
        try:
            taken = take()
        except BaseException:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            raise
        if not taken:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            return False
        try:
            self._publish(staging, job, sync=self._folder.durable)
        except FileNotFoundError:
            pass  # a sweep published it, taking this firer for dead (`sweep.clear_tmp`)
        return True

    def _reserve(self, job: _Submission, key: str, staging: Entry) -> str | None:
        """Take `key` for the job while it is staged (so that it counts as live); the live
        job that holds the key instead, if one does (then the staged job is removed)."""
        try:
            held = keys.reserve(self._folder, key, job.id, self._locate)
        except BaseException as exc:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            if isinstance(exc, OSError):  # a full or read-only disk, in the words every enqueue uses
                raise storage_error(exc, "take the job's key in", self._folder.path) from exc
            raise
        if held is not None:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
        return held

    def submit_many(self, calls: Iterable[Call], now: float) -> list[str]:
        """`Queue.enqueue_many`: every spec checked first, then staged and published with one barrier.

        Every spec is checked before anything is written. Publishing is not atomic
        as a whole: if it fails part way, the jobs already published stay published.
        """
        calls = list(calls)
        built = [self._build(call, now) for call in calls]
        if any(job.key is not None or job.depends_on for job in built):
            raise InvalidJob(
                "enqueue_many takes no keys or depends_on: enqueue each such job with enqueue() (or use chain, fan_in)"
            )
        if self._via_incoming:
            return [self._submit_incoming(call, now) for call in calls]
        staged: list[Entry] = []
        try:
            for job in built:
                staged.append(self._stage(job, now, sync=False))
        except BaseException:
            for entry in staged:
                files.remove_quietly(entry.name, dir_fd=entry.dir.fd)
            raise
        if self._folder.durable:
            files.sync_filesystem(self._folder.root.fd)
        for entry, job in zip(staged, built, strict=True):
            self._publish(entry, job, sync=False)
        if self._folder.durable:
            for state in (State.READY, State.SCHEDULED):
                self._folder.at(state).fsync()
        return [job.id for job in built]

    def _build(self, call: Call, now: float, job_id: str | None = None) -> _Submission:
        options = call.options or _NO_OPTIONS
        name, registered = _function_name(call.fn)
        if registered is not None:
            registered.check_arguments(tuple(call.args), call.kwargs)
        job_id = job_id or new_job_id(now)
        priority = _first(options.priority, registered and registered.priority, 0)
        args = list(call.args)
        kwargs = dict(call.kwargs)
        metadata = dict(options.metadata or {})
        due = _due(options, now)
        # JobSpec.to_json's fields and order, without building a JobSpec per job. Only what the
        # submitter gave: the manager resolves the rest when it claims (jobs.policy).
        document = {"format": SPEC_FORMAT, "id": job_id, "function": name, "args": args, "kwargs": kwargs}
        if options.max_attempts is not None:
            document["max_attempts"] = options.max_attempts
        if options.timeout is not None:
            document["timeout"] = options.timeout
        document["priority"] = priority
        if options.memory_limit is not None:
            document["memory_limit"] = options.memory_limit
        if options.output_limit is not None:
            document["output_limit"] = options.output_limit
        if options.backoff is not None:
            document["backoff"] = options.backoff
        document["created"] = now
        document["metadata"] = metadata
        if options.key is not None:
            document["key"] = options.key
        if options.depends_on:
            document["depends_on"] = list(options.depends_on)
        if options.allow_failure:
            document["allow_failure"] = True
        if self._via_incoming and due is not None and due > now:
            document["run_at"] = due  # a submission file carries its due time (the manager names the entry)
        data = _encode(document, args, kwargs, metadata)
        due = due if due is not None and due > now else None
        return _Submission(
            job_id, priority, data, due, options.key, options.if_key_taken, tuple(options.depends_on or ())
        )

    def _submit_incoming(self, call: Call, now: float) -> str:
        """Submit as a member: the id is chosen as the file is written (`incoming.submit`)."""
        try:
            return incoming.submit(
                self._folder, lambda job_id: self._build(call, now, job_id).data, durable=self._folder.durable
            )
        except OSError as exc:
            raise storage_error(exc, "submit to", self._folder.path) from exc

    def _stage(self, job: _Submission, now: float, *, sync: bool) -> Entry:
        """Write the job directory under `tmp/`, invisible to managers."""
        folder = self._folder
        staging = folder.tmp / job.id
        try:
            folder.make_dir(staging)
        except FileExistsError:
            raise  # another writer's job of the same id (a schedule's tick): not ours to remove
        except OSError as exc:
            raise storage_error(exc, "enqueue into", folder.path) from exc
        try:
            with staging.open() as made:
                # The event first: created before job.json's fsync, its entry is committed by that
                # fsync, so the folder's fsync below finds nothing new (two journal commits, not three).
                folder.log_event(made, "enqueued", now)
                files.write_new(SPEC_FILE, job.data, durable=sync, mode=folder.file_mode, dir_fd=made.fd)
                if sync:
                    made.fsync()
        except OSError as exc:
            files.remove_quietly(staging.name, dir_fd=staging.dir.fd)
            raise storage_error(exc, "enqueue into", folder.path) from exc
        files.checkpoint("enqueue:staged")
        return staging

    def _publish(self, staging: Entry, job: _Submission, *, sync: bool) -> None:
        if job.due is None:
            parent, name = self._folder.at(State.READY), ready_name(job.id, job.priority)
        else:
            parent, name = self._folder.at(State.SCHEDULED), scheduled_name(job.id, job.priority, job.due)
        moves.publish(staging, parent / name, sync)
        if job.due is None:
            self._on_ready(name)


def _taken(job: _Submission, held: str) -> str:
    """The id a submission of a taken key returns (or KeyTaken, if it asked)."""
    if job.if_key_taken == "raise":
        raise KeyTaken(job.key or "", held)
    return held


class Submitter:
    """`queue.with_options(...)`: enqueue with per-job options."""

    def __init__(self, publisher: Publisher, options: JobOptions) -> None:
        self._publisher = publisher
        self._options = options

    def enqueue(self, fn: Callable[..., Any] | str, /, *args: Any, **kwargs: Any) -> str:
        return self._publisher.submit(Call(fn, args, kwargs, self._options), time.time())

    def enqueue_many(self, calls: Iterable[Call]) -> list[str]:
        batch = (Call(c.fn, c.args, c.kwargs, c.options or self._options) for c in calls)
        return self._publisher.submit_many(batch, time.time())


def _function_name(fn: Callable[..., Any] | str) -> tuple[str, Registered | None]:
    """The registered name of `fn`, and its registration when `fn` is the function itself."""
    if isinstance(fn, str):
        if not fn.strip():
            raise InvalidJob("the function name is empty: name a registered function")
        return fn, None
    registered = registration_of(fn)
    if registered is None:
        raise InvalidJob(
            f"{default_name(fn)} is not registered: decorate it with @registry.job, or enqueue its registered name"
        )
    return registered.name, registered


def _due(options: JobOptions, now: float) -> float | None:
    """When the job may run, or None for now; InvalidJob if that is past the last moment
    a `scheduled/` name can hold."""
    if options.run_at is not None:
        if options.run_at > LATEST_DUE:
            raise InvalidJob(
                f"run_at {options.run_at:.0f} is past the year 2286: give run_at in epoch seconds, not milliseconds"
            )
        return options.run_at
    if not options.delay:
        return None
    if now + options.delay > LATEST_DUE:
        raise InvalidJob(
            f"a delay of {format_duration(options.delay)} is too long: a job can wait until the year 2286 at most"
        )
    return now + options.delay


def _encode(document: dict[str, Any], args: list[Any], kwargs: dict[str, Any], metadata: dict[str, Any]) -> bytes:
    """`job.json`'s bytes; on failure, name the first argument JSON cannot encode. A job whose
    arguments nest deeper than a manager reads is refused here, not buried at its claim."""
    given = (*args, *kwargs.values(), *metadata.values())
    if any(isinstance(value, dict | list | tuple) for value in given) and document_too_deep(document):
        raise InvalidJob(
            f"cannot enqueue: its arguments or metadata nest JSON more than {MAX_DEPTH} levels deep (counting "
            "job.json's own), which no manager reads (docs/SECURITY.md); pass flatter data"
        )
    try:
        return spec_json(document)
    except (TypeError, ValueError):
        pass
    named = [(f"argument {i}", value) for i, value in enumerate(args)]
    named += [(f"keyword argument {key!r}", value) for key, value in kwargs.items()]
    named.append(("metadata", metadata))
    for label, value in named:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ArgumentNotSerializable(
                f"cannot enqueue: {label} is not JSON-encodable ({exc}); pass plain data"
            ) from None
    raise ArgumentNotSerializable("cannot enqueue: a keyword argument name is not a string")


def _first(given: Any, registered: Any, default: Any) -> Any:
    """The first that is not None: the job's option, the registration's, the default."""
    if given is not None:
        return given
    return registered if registered is not None else default
