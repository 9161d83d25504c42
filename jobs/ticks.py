"""Firing periodic jobs: one job per schedule and tick, whatever the number of managers.

Every manager's sweeper fires the schedules it knows (the queue's, and those its
registry declares). A tick's job has an id derived from (schedule, tick) and a secret
only the queue's owner may read, and a tick is taken once with a link that never
replaces:

    ticks/.secret              32 random bytes (hex), mode 0600: made by the first firer
    ticks/NAME/TTTTTTTTTT      a handled tick (epoch seconds): names the job it enqueued,
                               or "-" (handled without a job: skipped, paused, first seen)
    ticks/NAME/.declared.json  a schedule declared in Python: what it says (for `schedule list`)

Without the secret, every future tick's id could be told from the schedule's name, and a
member of a shared queue could submit it first and hold the tick back (their ids are dated
ahead of their submission, so a future tick's would pass: `jobs.incoming`).

Firing one tick (`planner.Planner`):
1. stage the job as `tmp/ID` with mkdir, which only one firer can do at a time;
2. look at the tick's marker: a firer that finished the tick already wrote it (step 3
   comes before step 4), so a second firer stops here;
3. take the marker with link(2), naming ID (exactly one firer wins, NFS included);
4. publish `tmp/ID` with one rename, as any enqueue does.
A firer killed between 3 and 4 leaves its job in `tmp/` and the tick taken: a sweep
publishes it (`sweep.clear_tmp`, after `STALE` seconds). Killed between 1 and 3, it leaves
an untaken tick and a staged job: a sweep quarantines the job after the queue's `tmp_age`,
and the tick is fired then if it is still the newest one passed (a missed tick).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from jobs import files, moves, schedules
from jobs.errors import InvalidJob, JobsError
from jobs.folder import TICKS, QueueFolder
from jobs.handles import Dir
from jobs.job import State, is_job_id, ready_name

log = logging.getLogger(__name__)
DECLARED = ".declared.json"
NO_JOB = "-"
KEEP = 20  # markers kept per schedule; older ones never decide again
STALE = 60.0  # a tick's job still in tmp/ this long after its tick was taken: its firer died
_MARKER = re.compile(r"^\d{10}$")


SECRET = ".secret"


def tick_job_id(name: str, tick: float, secret: bytes = b"") -> str:
    """The id of the job of `name`'s tick: the tick's UTC time, then 52 bits of an HMAC of
    the name and the tick under the queue's secret (in the microseconds and the hex part):
    two schedules meet on one id once in 2**52, and nobody without the secret can tell
    the id of any tick in advance, not even from the ids of the ticks before it.
    (Without a secret: the ids of the ticks fired before there was one.)"""
    if secret:
        digest = hmac.new(secret, f"{name}\0{int(tick)}".encode(), hashlib.sha256).hexdigest()
    else:
        digest = hashlib.sha256(name.encode()).hexdigest()
    stamp = datetime.fromtimestamp(int(tick), UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{int(digest[8:13], 16) % 1_000_000:06d}-{digest[:8]}"


def secret(folder: QueueFolder) -> bytes:
    """The queue's tick secret, made by the first firer that needs it (readable by the owner only)."""
    ticks = folder.at(TICKS)
    try:
        return _read_secret(ticks)
    except FileNotFoundError:
        made = os.urandom(32).hex().encode() + b"\n"
        files.link_new(SECRET, made, durable=folder.durable, mode=0o600, dir_fd=ticks.fd)  # one firer's wins
        if folder.durable:
            ticks.fsync()
        return _read_secret(ticks)


def _read_secret(ticks: Dir) -> bytes:
    data, status = files.read_regular(SECRET, 128, ticks.fd)
    if stat.S_IMODE(status.st_mode) & 0o077 or status.st_uid != os.fstat(ticks.fd).st_uid:
        raise JobsError(f"{ticks.path}/{SECRET} may be read by others, or is not the owner's: remove it")
    return data.strip()


def marker_name(tick: float) -> str:
    return f"{int(tick):010d}"


@dataclass(frozen=True)
class Handled:
    """The newest handled tick of a schedule, and the job it enqueued (None: none)."""

    tick: float
    job_id: str | None


def newest(folder: QueueFolder, name: str) -> Handled | None:
    """The newest tick of schedule `name` that was handled, or None."""
    try:
        with folder.at(TICKS).sub(name) as ticks:
            return newest_in(ticks)
    except FileNotFoundError:
        return None


def newest_in(ticks: Dir) -> Handled | None:
    found = marker_ticks(ticks)
    if not found:
        return None
    try:
        text = files.read_limited(marker_name(found[-1]), 128, ticks.fd).decode("ascii", "replace").strip()
    except OSError:
        text = NO_JOB
    return Handled(float(found[-1]), None if text == NO_JOB else text)


def marker_ticks(ticks: Dir) -> list[int]:
    """The handled ticks of one schedule's folder, oldest first."""
    return sorted(int(name) for name in ticks.names() if _MARKER.match(name))


def take(ticks: Dir, tick: float, job_id: str, folder: QueueFolder) -> bool:
    """Mark `tick` handled, naming `job_id` (or "-"); False if another firer marked it first."""
    data = f"{job_id}\n".encode()
    if not files.link_new(marker_name(tick), data, durable=folder.durable, mode=folder.file_mode, dir_fd=ticks.fd):
        return False
    if folder.durable:
        ticks.fsync()
    files.checkpoint("tick:taken")
    return True


def forget_older(ticks: Dir) -> None:
    """Remove all but the newest `KEEP` markers."""
    for tick in marker_ticks(ticks)[:-KEEP]:
        files.unlink_if_there(marker_name(tick), ticks.fd)


def iso(tick: float) -> str:
    return datetime.fromtimestamp(tick, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def publish_abandoned(folder: QueueFolder, name: str, now: float, on_ready: Callable[[str], None]) -> bool:
    """Publish `tmp/NAME` if it is a tick's job whose firer died after taking the tick
    (the marker names it) over `STALE` seconds ago; False if it is not one."""
    staged = folder.tmp / name
    if not is_job_id(name):
        return False
    try:
        if not stat.S_ISDIR((found := staged.lstat()).st_mode) or now - found.st_mtime <= STALE:
            return False
        with staged.open() as job:
            spec = folder.read_spec(job, name)
    except (OSError, JobsError):
        return False  # not a tick's job: the usual rule for what is left in tmp/ applies
    schedule, tick = spec.metadata.get("schedule"), spec.metadata.get("tick")
    if not isinstance(schedule, str) or not isinstance(tick, int):
        return False
    if name not in (tick_job_id(schedule, tick, secret(folder)), tick_job_id(schedule, tick)):  # (or from before)
        return False
    try:
        with folder.at(TICKS).sub(schedules.check_name(schedule)) as ticks:
            taken = files.read_limited(marker_name(tick), 128, ticks.fd).decode("ascii", "replace").strip()
    except (OSError, InvalidJob):
        return False  # no marker (or none to read): not a tick's job
    if taken != name:
        return False
    target = ready_name(name, spec.priority)
    try:
        moves.publish(folder.tmp / name, folder.at(State.READY) / target, folder.durable)
    except FileNotFoundError:
        return True  # its firer published it meanwhile
    log.warning("schedule %s: published the job %s of tick %s, which its firer left in tmp/", schedule, name, iso(tick))
    on_ready(target)
    return True
