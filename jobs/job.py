"""The job model: states, ids, entry names and the immutable spec.

A job id is `YYYYMMDD-HHMMSS-ffffff-xxxxxxxx`: the UTC enqueue time to the
microsecond, then 8 random hex digits. Ids are safe file names and sort in
enqueue order; ids made by one process are strictly increasing.

The name of a job's entry depends on its state folder (see `jobs/__init__`):
`ready/RRR.ID` (RRR = 100 - priority, so names sort in claim order),
`scheduled/DUE.RRR.ID` (DUE = epoch milliseconds, 13 digits), and plain `ID`
in `claimed/OWNER/`, `done/` and `dead/`.
"""

from __future__ import annotations

import calendar
import enum
import json
import math
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any

from jobs.document import parse as parse_document
from jobs.errors import InvalidJob, InvalidJobId, UnsupportedFormat
from jobs.retry import Backoff
from jobs.units import LATEST_MOMENT, MAX_DURATION, MAX_SIZE, bytes_of, epoch_of, seconds_of

SPEC_FORMAT = 1
MAX_SPEC_BYTES = 1024 * 1024  # arguments are data for a call; bulk data goes by path (a parsed MiB is ~20 MiB)
MIN_PRIORITY, MAX_PRIORITY = -100, 100
LATEST_DUE = LATEST_MOMENT  # 13 digits of milliseconds in scheduled/ names: the year 2286
MAX_ATTEMPTS = 1_000_000  # past this, a retry policy means "for ever", which is a bug to find, not to run
MAX_FUNCTION = 500  # characters of a function's name (a module path and a name)
COMMAND = "forkvisor.command"  # the function of a command job (`jobs.command`)

# A moment a calendar has (days past a month's end are carried over by `created_at`): a name
# with a month 13 or an hour 25 is not a job's, so it is quarantined, not read as a time.
ID_PATTERN = r"[1-9]\d{3}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])-(?:[01]\d|2[0-3])[0-5]\d[0-5]\d-\d{6}-[0-9a-f]{8}"
_ID = ID_PATTERN
_ID_RE = re.compile(rf"^{_ID}$")
_READY_RE = re.compile(rf"^(\d{{3}})\.({_ID})$")
_SCHEDULED_RE = re.compile(rf"^(\d{{13}})\.(\d{{3}})\.({_ID})$")
_last_id_us = 0


class State(enum.StrEnum):
    """Where a job is; the value is the name of its state folder."""

    INCOMING = "incoming"  # submitted by a member of a shared queue as a file: not taken in yet
    READY = "ready"
    SCHEDULED = "scheduled"
    WAITING = "waiting"  # for the jobs it depends on to be done (`jobs.depends`)
    CLAIMED = "claimed"
    DONE = "done"
    DEAD = "dead"

    @property
    def terminal(self) -> bool:
        return self in (State.DONE, State.DEAD)


def new_job_id(now: float | None = None) -> str:
    """Make a fresh id: enqueue time to the microsecond, then 8 random hex digits.

    Ids made within a second of each other strictly increase within a process, so
    a batch keeps its order; an explicit `now` far from the last id starts afresh
    and drags no later id along with it.
    """
    global _last_id_us
    micros = int((time.time() if now is None else now) * 1_000_000)
    if micros <= _last_id_us < micros + 1_000_000:
        micros = _last_id_us + 1
    _last_id_us = micros
    return f"{_second_stamp(micros // 1_000_000)}-{micros % 1_000_000:06d}-{os.urandom(4).hex()}"


_last_stamp: tuple[int, str] = (-1, "")


def _second_stamp(second: int) -> str:
    """`YYYYMMDD-HHMMSS` of an epoch second, remembered for the next id of the same second
    (formatting a datetime costs more than the rest of the id)."""
    global _last_stamp
    if _last_stamp[0] != second:
        _last_stamp = (second, datetime.fromtimestamp(second, UTC).strftime("%Y%m%d-%H%M%S"))
    return _last_stamp[1]


def created_at(job_id: str) -> float:
    """The enqueue time written into a job id, in seconds since the epoch. Never raises for
    an id of the form (`ID_PATTERN`): a day past its month's end is carried over, as
    calendar arithmetic does (an id is a name that sorts; its moment only informs)."""
    parts = (job_id[0:4], job_id[4:6], job_id[6:8], job_id[9:11], job_id[11:13], job_id[13:15])
    seconds = calendar.timegm(tuple(int(part) for part in parts))
    return seconds + int(job_id[16:22]) / 1e6


def is_job_id(text: str) -> bool:
    return bool(_ID_RE.match(text))


def check_job_id(text: str) -> str:
    """Return `text` if it is a job id, else raise InvalidJobId saying what one looks like."""
    if not isinstance(text, str) or not is_job_id(text):
        raise InvalidJobId(
            f"{text!r} is not a job id: ids look like 20261123-103300-123456-a1b2c3d4 "
            "(UTC date, time, microseconds, 8 hex digits)"
        )
    return text


def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise InvalidJob(f"priority must be an integer, got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise InvalidJob(f"priority {priority} is out of range: use {MIN_PRIORITY}..{MAX_PRIORITY}")
    return priority


def ready_name(job_id: str, priority: int) -> str:
    return f"{100 - priority:03d}.{job_id}"


def scheduled_name(job_id: str, priority: int, due: float) -> str:
    """The entry of a job due at `due`; a due time past `LATEST_DUE` waits until then (the
    checks before keep it from happening: a longer name would not be read as a job's)."""
    return f"{max(0, math.ceil(min(due, LATEST_DUE) * 1000)):013d}.{100 - priority:03d}.{job_id}"


def parse_ready_name(name: str) -> tuple[str, int] | None:
    """Return (job id, priority) for a well-formed `ready/` name, else None."""
    match = _READY_RE.match(name)
    if not match or int(match[1]) > 100 - MIN_PRIORITY:
        return None
    return match[2], 100 - int(match[1])


def parse_scheduled_name(name: str) -> tuple[str, int, float] | None:
    """Return (job id, priority, due time) for a well-formed `scheduled/` name, else None."""
    match = _SCHEDULED_RE.match(name)
    if not match or int(match[2]) > 100 - MIN_PRIORITY:
        return None
    return match[3], 100 - int(match[2]), int(match[1]) / 1000


@dataclass(frozen=True)
class JobOptions:
    """Per-job options; None means "not given": the function's, the queue's or the built-in
    value applies (see `jobs.policy`). A timeout or memory limit of 0 means "no limit",
    whatever the function or the queue say.

    Durations may be seconds, text ("5m") or a `timedelta`; `run_at` epoch seconds or an
    aware `datetime`; `memory_limit` and `output_limit` bytes or text ("512M"); `backoff` text
    ("exponential 1s 5m", "fixed 30s") or a `Backoff`.
    """

    max_attempts: int | None = None
    timeout: float | None = None
    priority: int | None = None
    delay: float | None = None
    run_at: float | None = None
    memory_limit: int | None = None
    output_limit: int | None = None  # bytes of stdout and of stderr a run keeps (`jobs.output`)
    backoff: str | None = None
    metadata: Mapping[str, Any] | None = None
    key: str | None = None  # at most one live job per key in the queue (`jobs.keys`)
    if_key_taken: str = "return"  # a live job holds the key: "return" its id, or "raise" KeyTaken
    depends_on: Sequence[str] | None = None  # job ids: it waits until all are done (`jobs.depends`)
    allow_failure: bool = False  # with depends_on: run once they ended, done or dead

    def __post_init__(self) -> None:
        if self.delay is not None and self.run_at is not None:
            raise InvalidJob("give either delay or run_at, not both")
        try:
            self._normalise("timeout", seconds_of(self.timeout, "timeout"))
            self._normalise("delay", seconds_of(self.delay, "delay"))
            self._normalise("run_at", epoch_of(self.run_at, "run_at"))
            self._normalise("memory_limit", bytes_of(self.memory_limit, "memory_limit"))
            self._normalise("output_limit", bytes_of(self.output_limit, "output_limit"))
        except ValueError as exc:
            raise InvalidJob(str(exc)) from None
        if self.backoff is not None:
            if not isinstance(self.backoff, str | Backoff):
                raise InvalidJob(
                    f"a job's backoff must be text such as 'exponential 1s 5m' or a Backoff, got {self.backoff!r:.60} "
                    "(a tenacity wait can be given to @registry.job(backoff=...))"
                )
            self._normalise("backoff", str(Backoff.parse(str(self.backoff))))
        _check_positive_int("max_attempts", self.max_attempts, MAX_ATTEMPTS)
        _check_limit("timeout", self.timeout, MAX_DURATION, "100 years")
        _check_limit("memory_limit", self.memory_limit, MAX_SIZE, f"{MAX_SIZE} bytes")
        _check_limit("output_limit", self.output_limit, MAX_SIZE, f"{MAX_SIZE} bytes")
        if self.priority is not None:
            check_priority(self.priority)
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise InvalidJob(f"metadata must be a mapping, got {type(self.metadata).__name__}")
        if self.key is not None:
            check_key(self.key)
        if self.if_key_taken not in ("return", "raise"):
            raise InvalidJob(f'if_key_taken is "return" (the live job\'s id) or "raise", got {self.if_key_taken!r:.40}')
        if self.depends_on is not None:
            self._normalise("depends_on", check_depends_on(self.depends_on))
            if self.delay or self.run_at is not None:
                raise InvalidJob("a job with depends_on starts when they are done: give it no delay or run_at")
        if not isinstance(self.allow_failure, bool):
            raise InvalidJob(f"allow_failure is True or False, got {self.allow_failure!r:.40}")

    def _normalise(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)


MAX_KEY = 200  # characters
MAX_DEPENDS = 1000  # jobs one job may depend on


def check_depends_on(depends_on: object) -> tuple[str, ...]:
    """The ids a job depends on, if they are: a list of distinct job ids (at most 1,000)."""
    if isinstance(depends_on, str) or not isinstance(depends_on, Sequence):
        raise InvalidJob(f"depends_on is a list of job ids, got {depends_on!r:.80}")
    ids = tuple(depends_on)
    for job_id in ids:
        if not isinstance(job_id, str) or not is_job_id(job_id):
            raise InvalidJob(f"depends_on: {job_id!r:.60} is not a job id (YYYYMMDD-HHMMSS-ffffff-xxxxxxxx)")
    if len(set(ids)) != len(ids) or len(ids) > MAX_DEPENDS:
        raise InvalidJob(f"depends_on names each job once, at most {MAX_DEPENDS} of them")
    return ids


def check_key(key: object) -> str:
    """The key, if it is one: text of 1 to 200 printable characters (see `jobs.keys`)."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY or not key.isprintable():
        raise InvalidJob(f"a job's key must be 1 to {MAX_KEY} printable characters, got {key!r:.80}")
    return key


POLICY_FIELDS = ("max_attempts", "timeout", "memory_limit", "output_limit", "backoff")
"""The fields of a spec that a function's registration and the queue may also set."""


@dataclass(frozen=True)
class JobSpec:
    """What to run and how: the content of `job.json`, never changed after enqueue.

    The policy fields hold what the submitter gave, None where it gave nothing; the
    manager that claims the job resolves the rest (`jobs.policy`).
    """

    id: str
    function: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    max_attempts: int | None = None
    timeout: float | None = None  # 0: no limit
    priority: int = 0
    memory_limit: int | None = None  # 0: no limit
    output_limit: int | None = None  # 0: no limit
    backoff: str | None = None
    created: float = 0.0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    submitted_by: int | None = None  # the uid of a member who submitted it through incoming/ (set at take-in)
    key: str | None = None  # its unique key, if it has one (`jobs.keys`)
    depends_on: tuple[str, ...] = ()  # the jobs it waits for (`jobs.depends`)
    allow_failure: bool = False  # it runs even if one of them ends dead

    def to_json(self) -> bytes:
        document: dict[str, Any] = {
            "format": SPEC_FORMAT,
            "id": self.id,
            "function": self.function,
            "args": list(self.args),
            "kwargs": dict(self.kwargs),
        }
        given = {
            "max_attempts": self.max_attempts,
            "timeout": self.timeout,
            "priority": self.priority,
            "memory_limit": self.memory_limit,
            "output_limit": self.output_limit,
            "backoff": self.backoff,
        }
        document.update((key, value) for key, value in given.items() if value is not None)
        document.update(created=self.created, metadata=dict(self.metadata))
        if self.key is not None:
            document["key"] = self.key
        if self.depends_on:
            document["depends_on"] = list(self.depends_on)
        if self.allow_failure:
            document["allow_failure"] = True
        if self.submitted_by is not None:
            document["submitted_by"] = {"uid": self.submitted_by}
        return spec_json(document)

    @classmethod
    def from_json(cls, data: bytes, job_id: str) -> JobSpec:
        """Decode and validate `job.json`; raise InvalidJob saying what is wrong
        (UnsupportedFormat for a job written for a newer forkvisor)."""
        try:
            document = parse_document(data, "job.json")
        except InvalidJob as exc:
            raise InvalidJob(f"{exc}; rewrite it as docs/FORMAT.md shows") from None
        if not isinstance(document, dict):
            raise InvalidJob("job.json must hold a JSON object; see docs/FORMAT.md")
        return cls(id=job_id, **_validated_fields(document, job_id))


def spec_json(document: dict[str, Any]) -> bytes:
    """`job.json`'s bytes: exactly `json.dumps(document, indent=1, allow_nan=False)` and a newline,
    for any dict.

    The standard library encodes with `indent` in pure Python (a fifth of an enqueue's
    CPU); the fields are mostly strings, numbers, null, empty lists and objects of those (an
    outcome's cost, its error), which are formatted here directly, object by object. Anything
    else goes to `json.dumps` and is indented to its depth (JSON text holds no raw newline
    inside a string, so this is exact).
    Raises TypeError or ValueError as `json.dumps` does.
    """
    return (_value_text(document, "") + "\n").encode()


def _value_text(value: Any, pad: str = " ") -> str:
    """`value` as `json.dumps(value, indent=1)` writes it on a line indented by `pad`."""
    kind = type(value)
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        return scalar(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    if kind is dict and all(type(key) is str for key in value):  # (a record's nested fields: its cost, its error)
        if not value:
            return "{}"
        inner = pad + " "
        fields = ",\n".join([f"{inner}{_quoted(key)}: {_value_text(item, inner)}" for key, item in value.items()])
        return "{\n" + fields + "\n" + pad + "}"
    if kind is list and not value:
        return "[]"
    return json.dumps(value, indent=1, allow_nan=False).replace("\n", "\n" + pad)


_quoted = encode_basestring_ascii  # what json.dumps uses for strings (ensure_ascii)
_SCALARS: dict[type, Callable[[Any], str]] = {  # one lookup for the kinds most fields are
    str: _quoted,
    int: int.__repr__,
    bool: lambda value: "true" if value else "false",
    type(None): lambda value: "null",
}


_SPEC_TYPES: dict[str, tuple[type, ...]] = {
    "function": (str,),
    "args": (list,),
    "kwargs": (dict,),
    "max_attempts": (int, type(None)),
    "timeout": (int, float, type(None)),
    "priority": (int,),
    "memory_limit": (int, type(None)),
    "output_limit": (int, type(None)),
    "backoff": (str, type(None)),
    "created": (int, float),
    "metadata": (dict,),
    "key": (str, type(None)),
}


def _validated_fields(document: dict[str, Any], job_id: str) -> dict[str, Any]:
    version = document.get("format", SPEC_FORMAT)
    if isinstance(version, int) and not isinstance(version, bool) and version > SPEC_FORMAT:
        raise UnsupportedFormat(f"job.json has format {version}; this forkvisor reads format {SPEC_FORMAT}")
    if version != SPEC_FORMAT:
        raise InvalidJob(f"job.json has format {version!r}; this forkvisor reads format {SPEC_FORMAT}")
    if document.get("id", job_id) != job_id:
        raise InvalidJob(f"job.json names id {document['id']!r} but sits in the folder of {job_id}")
    if "function" not in document:
        raise InvalidJob('job.json has no "function": name the registered function to run')
    fields = {key: document[key] for key in _SPEC_TYPES if key in document}
    for key, value in fields.items():
        allowed = _SPEC_TYPES[key]
        if isinstance(value, bool) or not isinstance(value, allowed):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in allowed)
            raise InvalidJob(f'job.json field "{key}" must be {names}, got {value!r:.60}')
    JobOptions(
        max_attempts=fields.get("max_attempts"),
        timeout=fields.get("timeout"),
        priority=fields.get("priority"),
        memory_limit=fields.get("memory_limit"),
        output_limit=fields.get("output_limit"),
        backoff=fields.get("backoff"),
    )
    if not fields["function"]:
        raise InvalidJob('job.json field "function" is empty: name the registered function to run')
    if len(fields["function"]) > MAX_FUNCTION:
        raise InvalidJob(f'job.json field "function" must be a name of 1 to {MAX_FUNCTION} characters')
    if not 0 <= fields.get("created", 0) <= LATEST_DUE:
        raise InvalidJob(
            f'job.json field "created" must be epoch seconds from 0 to {LATEST_DUE:.0f}, '
            f"got {_short(fields['created'])}"
        )
    if fields.get("key") is not None:
        check_key(fields["key"])  # a hand-written job.json gets the check an enqueue gets
    if document.get("depends_on") is not None:
        fields["depends_on"] = check_depends_on(document["depends_on"])
        if job_id in fields["depends_on"]:
            raise InvalidJob(f"job {job_id} depends on itself")
    if document.get("allow_failure") is not None:
        if not isinstance(document["allow_failure"], bool):
            raise InvalidJob(
                f'job.json field "allow_failure" must be true or false, got {document["allow_failure"]!r:.40}'
            )
        fields["allow_failure"] = document["allow_failure"]
    fields["args"] = tuple(fields.get("args", ()))
    if document.get("submitted_by") is not None:
        fields["submitted_by"] = _submitter_uid(document["submitted_by"])
    return fields


def _submitter_uid(recorded: Any) -> int:
    """The uid in a `"submitted_by": {"uid": N, ...}` that a take-in wrote."""
    uid = recorded.get("uid") if isinstance(recorded, dict) else None
    if isinstance(uid, bool) or not isinstance(uid, int) or not 0 <= uid < 2**32:
        raise InvalidJob(f'job.json field "submitted_by" must be {{"uid": N, ...}}, got {recorded!r:.60}')
    return uid


def _check_number(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidJob(f"{name} must be a finite number, got {_short(value)}")


def _check_limit(name: str, value: float | None, most: float, shown: str) -> None:
    """A timeout or a memory limit: positive up to `most`, or 0 for "no limit"."""
    _check_number(name, value)
    if value is not None and not 0 <= value <= most:
        raise InvalidJob(f"{name} must be positive (or 0 for no limit), got {_short(value)}; at most {shown}")


def _check_positive_int(name: str, value: object, most: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidJob(f"{name} must be a whole number of at least 1, got {_short(value)}; at most {most}")


def _short(value: object) -> str:
    """A value in a message, cut (a member's number may have 4,000 digits)."""
    shown = repr(value)
    return shown if len(shown) <= 60 else f"{shown[:40]}... ({len(shown)} characters)"


def indented_json(document: dict[str, Any]) -> bytes:
    """`json.dumps(document, indent=1, default=repr)` and a newline. Every attempt's
    `outcome.json` goes through here, so a flat record takes `spec_json`'s fast path;
    what it refuses (NaN, an object JSON cannot encode) gets the standard encoder."""
    try:
        return spec_json(document)
    except (TypeError, ValueError):
        return json.dumps(document, indent=1, default=repr).encode() + b"\n"
