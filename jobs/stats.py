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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from jobs import document, files
from jobs.errors import InvalidJob, JobsError
from jobs.folder import STATS, QueueFolder
from jobs.handles import Dir
from jobs.job import State
from jobs.lease import REAPING_PREFIX

#: The upper bounds (seconds) of the run-duration histogram's buckets, +Inf last.
BUCKETS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, math.inf)
#: The upper bounds (bytes) of the peak-memory histogram's buckets: 16 MiB, doubling to
#: 32 GiB, +Inf last. Doubling keeps a typical limit (256M, 512M, 1G...) on a bound, so
#: the runs that came near theirs show as a bucket, and 13 of them stay cheap per function.
MEMORY_BUCKETS = (*(float(16 << 20 << n) for n in range(12)), math.inf)
#: How a run ended: done, retried (it failed and will run again), dead, or given back
#: without using an attempt (a drain, a stopping manager).
OUTCOMES = ("succeeded", "retried", "dead", "released")
ROLES = ("manager", "sweeper")
MAX_BYTES = 1 << 20
MAX_FUNCTIONS = 1000  # per file: functions are the owner's registered names, far fewer
_NAME = re.compile(r"^(manager|sweeper)\.([A-Za-z0-9_.-]+)\.json$")


@dataclass
class Histogram:
    """Counts per bucket of `bounds` (not cumulative) and the sum of what was counted."""

    bounds: ClassVar[tuple[float, ...]] = BUCKETS
    buckets: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * len(self.bounds)

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def add(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add_all(self, other: Histogram, sign: int = 1) -> None:
        self.buckets = [a + sign * b for a, b in zip(self.buckets, other.buckets, strict=True)]
        self.total += sign * other.total


class Durations(Histogram):
    """One function's run durations (seconds)."""


class Peaks(Histogram):
    """One function's runs by their peak memory (bytes)."""

    bounds = MEMORY_BUCKETS


H = TypeVar("H", bound=Histogram)


@dataclass(frozen=True)
class RunCost:
    """What one run used, as its `outcome.json`'s `cost` says (docs/FORMAT.md). None: not
    measured (no memory cgroup; no count of processes where runs have no cgroup)."""

    cpu_user: float = 0.0
    cpu_system: float = 0.0
    peak_memory: int | None = None
    processes: int | None = None
    oom_kills: int = 0

    @classmethod
    def of(cls, cost: dict[str, Any]) -> RunCost:
        """From a `cost` the manager just made (never from a file a job could have written)."""
        return cls(
            cost["cpu_user"],
            cost["cpu_system"],
            cost.get("peak_memory"),
            cost.get("processes_seen"),  # (absent from a cost read by wait4)
            cost.get("oom_kills") or 0,
        )


@dataclass
class Tally:
    """Counters of one process, or the sum of several."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)  # (function, outcome) -> runs
    durations: dict[str, Durations] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # function -> CPU seconds of its runs (every process)
    # The same split by mode: kept beside `cpu`, not instead of it, so that older readers
    # and the files of older managers (which have only `cpu`) keep their meaning.
    cpu_user: dict[str, float] = field(default_factory=dict)
    cpu_system: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, Peaks] = field(default_factory=dict)  # function -> its runs' peak memory, where measured
    processes: dict[str, int] = field(default_factory=dict)  # function -> processes seen in its runs, where counted
    oom_kills: dict[str, int] = field(default_factory=dict)  # function -> processes the kernel killed at its limit
    reverts: int = 0  # claims a sweeper gave back because their owner died or its lease expired
    expiries: int = 0  # owners a sweeper found dead or expired (and fenced)
    races: int = 0  # claims a manager lost: the entry there when it looked, gone at its rename
    gone: int = 0  # names a manager's index gave that were gone when it looked (taken earlier)
    wakeups: int = 0  # turns of a manager's loop woken by new names in ready/
    changes: int = field(default=0, compare=False)  # counts made by this object: has it changed?

    def run_ended(self, function: str, outcome: str, seconds: float, cost: RunCost = RunCost()) -> None:
        self.changes += 1
        key = (function, outcome)
        self.runs[key] = self.runs.get(key, 0) + 1
        self.durations.setdefault(function, Durations()).add(seconds)
        self._cost(function, cost)

    def _cost(self, function: str, cost: RunCost) -> None:
        self.cpu[function] = self.cpu.get(function, 0.0) + cost.cpu_user + cost.cpu_system
        self.cpu_user[function] = self.cpu_user.get(function, 0.0) + cost.cpu_user
        self.cpu_system[function] = self.cpu_system.get(function, 0.0) + cost.cpu_system
        if cost.peak_memory is not None:  # an unmeasured peak is not a peak of 0
            self.peaks.setdefault(function, Peaks()).add(cost.peak_memory)
        if cost.processes is not None:
            self.processes[function] = self.processes.get(function, 0) + cost.processes
        if cost.oom_kills:
            self.oom_kills[function] = self.oom_kills.get(function, 0) + cost.oom_kills

    def add(self, other: Tally, sign: int = 1) -> None:
        """Add `other`'s counts to these (subtract them with `sign` -1)."""
        for key, count in other.runs.items():
            self.runs[key] = self.runs.get(key, 0) + sign * count
        for function, durations in other.durations.items():
            self.durations.setdefault(function, Durations()).add_all(durations, sign)
        for function, peaks in other.peaks.items():
            self.peaks.setdefault(function, Peaks()).add_all(peaks, sign)
        for mine, theirs in self._per_function_counts(other):
            for function, value in theirs.items():
                mine[function] = mine.get(function, 0) + sign * value
        self.reverts += sign * other.reverts
        self.expiries += sign * other.expiries
        self.races += sign * other.races
        self.gone += sign * other.gone
        self.wakeups += sign * other.wakeups

    def _per_function_counts(self, other: Tally) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [
            (self.cpu, other.cpu),
            (self.cpu_user, other.cpu_user),
            (self.cpu_system, other.cpu_system),
            (self.processes, other.processes),
            (self.oom_kills, other.oom_kills),
        ]

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
            "durations": _histograms_json(self.durations),
            "cpu": self.cpu,
            "cpu_user": self.cpu_user,
            "cpu_system": self.cpu_system,
            "peak_memory": _histograms_json(self.peaks),
            "processes": self.processes,
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
        runs = found.get("runs", [])
        if not isinstance(runs, list):
            raise InvalidJob("stats: runs must be a list")
        for row in runs[: MAX_FUNCTIONS * len(OUTCOMES)]:
            if not (isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and row[1] in OUTCOMES):
                raise InvalidJob(f"stats: a run count must be [function, outcome, count], not {row!r:.80}")
            tally.runs[(row[0], row[1])] = _count(row[2])
        tally.durations = _histograms(found.get("durations", {}), Durations, "durations")
        # Each below is absent from the files of older managers: none counted yet.
        tally.peaks = _histograms(found.get("peak_memory", {}), Peaks, "peak_memory")
        tally.cpu = _per_function(found.get("cpu", {}), _seconds, "cpu")
        tally.cpu_user = _per_function(found.get("cpu_user", {}), _seconds, "cpu_user")
        tally.cpu_system = _per_function(found.get("cpu_system", {}), _seconds, "cpu_system")
        tally.processes = _per_function(found.get("processes", {}), _count, "processes")
        tally.oom_kills = _per_function(found.get("oom_kills", {}), _count, "oom_kills")
        return tally


def _histograms_json(found: Mapping[str, Histogram]) -> dict[str, Any]:
    return {name: {"buckets": each.buckets, "sum": each.total} for name, each in found.items()}


def _histograms(found: Any, kind: type[H], what: str) -> dict[str, H]:
    """`{"FUNCTION": {"buckets": [COUNT, ...], "sum": NUMBER}}`, one bucket per bound of `kind`."""
    size = len(kind.bounds)
    histograms = {}
    for function, each in _per_function(found, lambda each: each, what).items():
        buckets = each.get("buckets") if isinstance(each, dict) else None
        total = each.get("sum") if isinstance(each, dict) else None
        if not (isinstance(buckets, list) and len(buckets) == size) or not isinstance(total, int | float):
            raise InvalidJob(f"stats: the {what} of {function!r:.80} are not a histogram of {size}")
        histograms[function] = kind([_count(n) for n in buckets], float(total))
    return histograms


def _per_function(found: Any, check: Callable[[Any], Any], what: str) -> dict[str, Any]:
    if not isinstance(found, dict) or len(found) > MAX_FUNCTIONS:
        raise InvalidJob(f"stats: {what} must be an object of at most {MAX_FUNCTIONS} functions")
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


__all__ = [
    "BUCKETS",
    "MEMORY_BUCKETS",
    "OUTCOMES",
    "Durations",
    "Histogram",
    "Peaks",
    "RunCost",
    "StatsFile",
    "Tally",
    "read_all",
]
