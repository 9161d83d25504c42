"""What the managers of a queue did, counted: runs by function and outcome, their
durations, and the claims sweepers took back. The counters behind `/metrics`.

A folder scan cannot give them (a million done jobs would each be read, and a purged
job would make a counter go down), so the processes that do the work count it:

- Each manager (and each sweeper) counts in memory and writes its totals to
  `stats/ROLE.OWNER.json` at most every few seconds and when it stops, replacing
  the file in one rename. Only the queue's owner writes `stats/`.
- A manager starting adopts the file of one manager that is gone (its owner folder
  is no longer in `claimed/`): it renames that file to its own name and counts on
  from its totals. The rename decides between two adopters. So the files stay as
  many as the managers that ever ran at the same time, and their sum only grows:
  what Prometheus calls a counter.
- A manager whose file was adopted while it lived (its owner folder was reaped
  while it stalled) notices at its next write (the file is gone) and starts a new
  file with only what it counted since its last write: nothing is counted twice.

Readers (`forkvisor metrics`, the web page) sum every file; a file that is not a
regular, well-formed stats file is skipped.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jobs import document, files
from jobs.errors import InvalidJob, JobsError
from jobs.folder import STATS, QueueFolder
from jobs.handles import Dir
from jobs.job import State
from jobs.lease import REAPING_PREFIX

#: The upper bounds (seconds) of the run-duration histogram's buckets, +Inf last.
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf)
#: How a run ended: done, retried (it failed and will run again), dead, or given back
#: without using an attempt (a drain, a stopping manager).
OUTCOMES = ("succeeded", "retried", "dead", "released")
ROLES = ("manager", "sweeper")
MAX_BYTES = 1 << 20
MAX_FUNCTIONS = 1000  # per file: functions are the owner's registered names, far fewer
_NAME = re.compile(r"^(manager|sweeper)\.([A-Za-z0-9_.-]+)\.json$")


@dataclass
class Durations:
    """One function's run durations as a histogram: counts per bucket of `BUCKETS`."""

    buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS))
    total: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def add(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(BUCKETS, seconds)] += 1
        self.total += seconds


@dataclass
class Tally:
    """Counters of one process, or the sum of several."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)  # (function, outcome) -> runs
    durations: dict[str, Durations] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # function -> CPU seconds of its runs (every process)
    oom_kills: dict[str, int] = field(default_factory=dict)  # function -> processes the kernel killed at its limit
    reverts: int = 0  # claims a sweeper gave back because their owner died or its lease expired
    expiries: int = 0  # owners a sweeper found dead or expired (and fenced)
    races: int = 0  # claims a manager lost: the entry there when it looked, gone at its rename
    gone: int = 0  # names a manager's index gave that were gone when it looked (taken earlier)
    wakeups: int = 0  # turns of a manager's loop woken by new names in ready/
    changes: int = field(default=0, compare=False)  # counts made by this object: has it changed?

    def run_ended(self, function: str, outcome: str, seconds: float, cpu: float = 0.0, oom_kills: int = 0) -> None:
        self.changes += 1
        self.cpu[function] = self.cpu.get(function, 0.0) + cpu
        if oom_kills:
            self.oom_kills[function] = self.oom_kills.get(function, 0) + oom_kills
        key = (function, outcome)
        self.runs[key] = self.runs.get(key, 0) + 1
        found = self.durations.get(function)
        if found is None:
            found = self.durations[function] = Durations()
        found.add(seconds)

    def add(self, other: Tally, sign: int = 1) -> None:
        """Add `other`'s counts to these (subtract them with `sign` -1)."""
        for key, count in other.runs.items():
            self.runs[key] = self.runs.get(key, 0) + sign * count
        for function, durations in other.durations.items():
            mine = self.durations.setdefault(function, Durations())
            mine.buckets = [a + sign * b for a, b in zip(mine.buckets, durations.buckets, strict=True)]
            mine.total += sign * durations.total
        for function, seconds in other.cpu.items():
            self.cpu[function] = self.cpu.get(function, 0.0) + sign * seconds
        for function, kills in other.oom_kills.items():
            self.oom_kills[function] = self.oom_kills.get(function, 0) + sign * kills
        self.reverts += sign * other.reverts
        self.expiries += sign * other.expiries
        self.races += sign * other.races
        self.gone += sign * other.gone
        self.wakeups += sign * other.wakeups

    def copy(self) -> Tally:
        copied = Tally()
        copied.add(self)
        return copied

    def functions(self) -> set[str]:
        return {function for function, _ in self.runs} | set(self.durations) | set(self.cpu)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "forkvisor-stats",
            "version": 1,
            "runs": [[function, outcome, count] for (function, outcome), count in sorted(self.runs.items())],
            "durations": {name: {"buckets": each.buckets, "sum": each.total} for name, each in self.durations.items()},
            "cpu": self.cpu,
            "oom_kills": self.oom_kills,
            "reverts": self.reverts,
            "expiries": self.expiries,
            "races": self.races,
            "gone": self.gone,
            "wakeups": self.wakeups,
        }

    @classmethod
    def from_json(cls, found: Any) -> Tally:
        """A tally from a stats file's document; InvalidJob if it is not one."""
        if not isinstance(found, dict) or found.get("kind") != "forkvisor-stats":
            raise InvalidJob("not a forkvisor stats document")
        tally = cls(reverts=_count(found.get("reverts", 0)), expiries=_count(found.get("expiries", 0)))
        tally.races, tally.wakeups = _count(found.get("races", 0)), _count(found.get("wakeups", 0))  # (older: none)
        tally.gone = _count(found.get("gone", 0))
        runs, durations = found.get("runs", []), found.get("durations", {})
        if not isinstance(runs, list) or not isinstance(durations, dict) or len(durations) > MAX_FUNCTIONS:
            raise InvalidJob("stats: runs must be a list and durations an object of at most 1000 functions")
        for row in runs[: MAX_FUNCTIONS * len(OUTCOMES)]:
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and row[1] in OUTCOMES):
                raise InvalidJob(f"stats: a run count must be [function, outcome, count], not {row!r:.80}")
            tally.runs[(row[0], row[1])] = _count(row[2])
        for function, each in durations.items():
            buckets = each.get("buckets") if isinstance(each, dict) else None
            total = each.get("sum") if isinstance(each, dict) else None
            if not (isinstance(buckets, list) and len(buckets) == len(BUCKETS)) or not isinstance(total, int | float):
                raise InvalidJob(f"stats: the durations of {function!r:.80} are not a histogram of {len(BUCKETS)}")
            tally.durations[function] = Durations([_count(n) for n in buckets], float(total))
        tally.cpu = _per_function(found.get("cpu", {}), _seconds)  # (absent from files of older managers)
        tally.oom_kills = _per_function(found.get("oom_kills", {}), _count)
        return tally


def _per_function(found: Any, check: Callable[[Any], Any]) -> dict[str, Any]:
    if not isinstance(found, dict) or len(found) > MAX_FUNCTIONS:
        raise InvalidJob("stats: cpu and oom_kills must be objects of at most 1000 functions")
    return {str(function): check(value) for function, value in found.items()}


def _seconds(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value < 1e15:
        raise InvalidJob(f"stats: seconds must be a number, at least 0, not {value!r:.80}")
    return float(value)


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidJob(f"stats: a count must be a whole number, at least 0, not {value!r:.80}")
    return value


class StatsFile:
    """One process's counters and the file it keeps them in (`stats/ROLE.OWNER.json`)."""

    def __init__(self, folder: QueueFolder, role: str) -> None:
        if role not in ROLES:
            raise ValueError(f"a stats file's role is one of {ROLES}, not {role!r}")
        self.folder = folder
        self.role = role
        self.tally = Tally()
        self._name: str | None = None
        self._written: Tally = Tally()  # what the file held after the last write
        self._inode: int | None = None

    def start(self, owner: str) -> None:
        """Take the counters this process goes on from: its own file's (a restarted sweeper),
        else a gone manager's, adopted by a rename; else none."""
        stats = _stats_dir(self.folder)
        self._name = name = f"{self.role}.{owner}.json"
        if stats is None:
            return
        base = _read(stats, name) or self._adopt(stats, name)
        if base is not None:
            self.tally.add(base)
            self._written = base.copy()
            self._inode = _inode(stats, name)

    def _adopt(self, stats: Dir, name: str) -> Tally | None:
        """The counters of one gone process of this role, renamed to `name` (None: none)."""
        for gone in _gone_files(self.folder, stats, self.role):
            try:
                files.move(gone, name, src_dir_fd=stats.fd, dst_dir_fd=stats.fd)
            except (OSError, JobsError):
                continue  # another manager adopted it first
            return _read(stats, name)
        return None

    def write(self, owner: str) -> None:
        """Write the totals; OSError or JobsError if the store refuses (try again later)."""
        stats = self.folder.at(STATS)
        if self._name is None:
            self._name = f"{self.role}.{owner}.json"
        elif self._inode is not None and _inode(stats, self._name) != self._inode:
            # Adopted while this process lived: that file keeps what it held; go on with the rest.
            self.tally.add(self._written, sign=-1)
            self._name = f"{self.role}.{owner}.json"
            self._written = Tally()
        data = json.dumps(self.tally.to_json(), separators=(",", ":")).encode()
        files.replace_file(self._name, data, durable=False, mode=self.folder.file_mode, dir_fd=stats.fd)
        self._inode = _inode(stats, self._name)
        self._written = self.tally.copy()


def read_all(folder: QueueFolder) -> Tally:
    """The sum of every process's counters in the queue (a bad file is skipped)."""
    total = Tally()
    stats = _stats_dir(folder)
    if stats is None:
        return total
    for name in stats.names():
        if _NAME.match(name) and (found := _read(stats, name)) is not None:
            total.add(found)
    return total


def _stats_dir(folder: QueueFolder) -> Dir | None:
    try:
        return folder.at(STATS)
    except (OSError, JobsError):
        return None  # no stats/ yet: a queue made by an older forkvisor, not opened by its owner since


def _read(stats: Dir, name: str) -> Tally | None:
    try:
        return Tally.from_json(document.read(name, MAX_BYTES, f"stats file {name}", dir_fd=stats.fd))
    except (OSError, JobsError):
        return None


def _inode(stats: Dir, name: str) -> int | None:
    try:
        return stats.lstat(name).st_ino
    except FileNotFoundError:
        return None


def _gone_files(folder: QueueFolder, stats: Dir, role: str) -> Iterable[str]:
    """The files of `role` whose owner folder is no longer in `claimed/`."""
    owners = {name.removeprefix(REAPING_PREFIX) for name in folder.at(State.CLAIMED).names()}
    for name in sorted(stats.names()):
        matched = _NAME.match(name)
        if matched and matched.group(1) == role and matched.group(2) not in owners:
            yield name


__all__ = ["BUCKETS", "OUTCOMES", "Durations", "StatsFile", "Tally", "read_all"]
