"""Owners and leases: who holds the jobs in `claimed/OWNER/`, and until when.

An owner is a manager. It registers a folder `claimed/OWNER/` holding
`.owner.json` (host, pid, process start time, boot id, lease length), whose
mtime is its heartbeat, and `.functions.json`, the functions it runs and the
policy each declares (so `status` can tell which ready jobs no running manager
can serve). A lease is expired when the file
system's clock (the mtime of a file the sweeper has just touched) is past the
heartbeat by more than the lease length, so a host whose clock is off does not
expire healthy leases. On the same host the caller can say sooner that an
owner is dead (pid + start time + boot id): liveness is a predicate passed in,
because this package starts and inspects no processes.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from jobs.config import BUILT_IN
from jobs.document import parse as parse_document
from jobs.errors import InvalidJob

OWNER_FILE = ".owner.json"
FUNCTIONS_FILE = ".functions.json"
SKIPPED_FILES = {  # what it could not handle, by whom
    "claims": ".skipped-claims.json",
    "sweep": ".skipped-sweep.json",
    "take-in": ".skipped-take-in.json",
}
OWNER_FILES = (OWNER_FILE, FUNCTIONS_FILE, *SKIPPED_FILES.values())  # an owner folder's own files, beside its jobs
REAPING_PREFIX = "reaping."
DEFAULT_LEASE = BUILT_IN["lease"]  # for owners that do not say; a manager always gives its own
_OWNER_RE = re.compile(r"^[A-Za-z0-9-]{1,64}\.\d{1,10}\.[0-9a-f]{6}$")


@dataclass(frozen=True)
class Owner:
    """A manager that holds claims, as recorded in its `.owner.json`."""

    name: str
    host: str
    pid: int
    start_time: float | None = None
    boot_id: str | None = None
    lease: float = DEFAULT_LEASE
    started: float = 0.0
    pid_namespace: str | None = None
    concurrency: int | None = None  # how many of the queue's jobs it runs at once, at most
    runs: str | None = None  # the cgroup folder holding its runs' cgroups (None: its runs have none)
    containment: str | None = None  # how it contains its runs: "cgroup" or "processes" (None: an older manager)

    @classmethod
    def new(cls, pid: int | None = None, **details: Any) -> Owner:
        """An owner for this host and `pid`, with a fresh unique folder name."""
        pid = os.getpid() if pid is None else pid
        host = socket.gethostname()
        return cls(name=f"{host_part(host)}.{pid}.{os.urandom(3).hex()}", host=host, pid=pid, **details)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode() + b"\n"

    @classmethod
    def from_json(cls, data: bytes) -> Owner:
        """Decode `.owner.json`; raise InvalidJob if any field has the wrong type."""
        document = parse_document(data, "owner file")
        try:
            known = {key: value for key, value in document.items() if key in cls.__dataclass_fields__}
            owner = cls(**known)  # fields a newer forkvisor added are ignored, not a reason to reap
        except (TypeError, AttributeError) as exc:
            raise InvalidJob(f"owner file is not valid: {exc}") from None
        checks = [
            isinstance(owner.name, str) and isinstance(owner.host, str),
            _is_number(owner.pid) and isinstance(owner.pid, int),
            owner.start_time is None or _is_number(owner.start_time),
            owner.boot_id is None or isinstance(owner.boot_id, str),
            owner.pid_namespace is None or isinstance(owner.pid_namespace, str),
            _is_number(owner.lease) and owner.lease > 0,
            _is_number(owner.started),
            owner.concurrency is None or (_is_number(owner.concurrency) and isinstance(owner.concurrency, int)),
            owner.runs is None or isinstance(owner.runs, str),
            owner.containment is None or isinstance(owner.containment, str),
        ]
        if not all(checks):
            raise InvalidJob(f"owner file has a field of the wrong type: {owner}")
        return owner


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_owner_name(name: str) -> bool:
    return bool(_OWNER_RE.match(name))


def host_part(host: str) -> str:
    """How an owner's name begins on `host` (HOST.PID.RANDOM)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", host)[:64] or "host"


Liveness = Callable[[Owner], bool | None]
"""True: the owner's process is alive; False: it is dead; None: cannot tell (another host)."""


def unknown_liveness(owner: Owner) -> bool | None:
    """The liveness predicate that knows nothing: only lease expiry counts."""
    return None


def is_expired(owner: Owner, heartbeat: float, now: float) -> bool:
    """Whether `owner`'s lease ran out, both times read from the file system's clock."""
    return now > heartbeat + owner.lease
