"""Prometheus metrics of one or several queues, read from their folders: what the web
server's `/metrics` serves and `forkvisor metrics` prints or writes for node_exporter's
textfile collector.

Gauges come from the folder at each scrape (`snapshot.take`: counts, managers, the oldest
wait); counters come from what the managers and sweepers counted (`jobs.stats`), so they
survive restarts and add up across hosts. Labels are bounded: queue (the folder's path),
state, function (registered names only: a manager runs nothing else), outcome, and for
the heartbeat age the owner name of each live manager. Never a job id.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, TypeAlias

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from jobs import DURATION_BUCKETS, MEMORY_BUCKETS, OUTCOMES, JobsError, Queue, State, Tally
from supervisor import snapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXTFILE_MODE = 0o644  # node_exporter reads it as its own user (and serves it to whoever scrapes it)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


Reading: TypeAlias = tuple[str, snapshot.Snapshot | None, Tally | None]  # a queue, read (None: it could not be)


def read(queues: Sequence[Queue]) -> list[Reading]:
    """Each queue's path, snapshot and counters (None, None where it cannot be read)."""
    readings: list[Reading] = []
    for queue in queues:
        try:
            readings.append((str(queue.path), snapshot.take(queue), queue.stats()))
        except (OSError, JobsError):
            readings.append((str(queue.path), None, None))
    return readings


def families(readings: Iterable[Reading]) -> list[Metric]:
    """Every metric family for `readings`: (queue, its snapshot, its counters), None where
    the queue could not be read (then only `forkvisor_queue_up` 0 is said of it)."""
    up = GaugeMetricFamily("forkvisor_queue_up", "1 if the queue folder could be read", labels=["queue"])
    jobs = GaugeMetricFamily("forkvisor_jobs", "Jobs in each state", labels=["queue", "state"])
    oldest = GaugeMetricFamily(
        "forkvisor_oldest_ready_age_seconds",
        "How long the oldest ready job has waited (0: none ready)",
        labels=["queue"],
    )
    unserved = GaugeMetricFamily(
        "forkvisor_unserved_ready_jobs",
        "Ready jobs (among the first 1000) whose function no live manager runs",
        labels=["queue"],
    )
    paused = GaugeMetricFamily("forkvisor_paused", "1 if the whole queue is paused", labels=["queue"])
    managers = GaugeMetricFamily("forkvisor_managers_alive", "Managers whose lease is current", labels=["queue"])
    heartbeat = GaugeMetricFamily(
        "forkvisor_manager_heartbeat_age_seconds", "Seconds since each manager's heartbeat", labels=["queue", "owner"]
    )
    running = GaugeMetricFamily("forkvisor_running_jobs", "Jobs running now", labels=["queue"])
    runs = CounterMetricFamily(
        "forkvisor_runs", "Runs that ended, by function and outcome", labels=["queue", "function", "outcome"]
    )
    retries = CounterMetricFamily("forkvisor_retries", "Failed runs that will run again", labels=["queue", "function"])
    dead = CounterMetricFamily("forkvisor_dead", "Runs after which the job went to dead/", labels=["queue", "function"])
    durations = HistogramMetricFamily(
        "forkvisor_run_duration_seconds", "Wall time of each run", labels=["queue", "function"]
    )
    cpu = CounterMetricFamily(
        "forkvisor_run_cpu_seconds",
        "CPU time of runs: every process of each with cgroups, else the job's and those it waited for",
        labels=["queue", "function"],
    )
    cost = _cost_families()
    expiries = CounterMetricFamily(
        "forkvisor_lease_expiries", "Managers a sweeper found dead or past their lease", labels=["queue"]
    )
    reverts = CounterMetricFamily(
        "forkvisor_lease_reverts", "Claims a sweeper gave back after their manager's lease ended", labels=["queue"]
    )
    races = CounterMetricFamily(
        "forkvisor_claim_races",
        "Claims a manager lost: the job taken by another between its look and its rename",
        labels=["queue"],
    )
    wakeups = CounterMetricFamily(
        "forkvisor_ready_wakeups", "Turns of managers' loops woken by new jobs in ready/", labels=["queue"]
    )
    for queue, taken, tally in readings:
        up.add_metric([queue], 0 if taken is None else 1)
        if taken is None or tally is None:
            continue
        for state in State:
            if state.value in taken.counts:
                jobs.add_metric([queue, state.value], taken.counts[state.value])
        oldest.add_metric([queue], taken.oldest_ready_age or 0.0)
        unserved.add_metric([queue], taken.unserved.count)
        paused.add_metric([queue], 1 if taken.paused_all else 0)
        live = [manager for manager in taken.managers if manager.live]
        managers.add_metric([queue], len(live))
        for manager in live:
            heartbeat.add_metric([queue, manager.owner], manager.heartbeat_age)
        running.add_metric([queue], len(taken.running))
        _add_counters(queue, tally, runs, retries, dead, durations)
        for function in sorted(tally.cpu):
            cpu.add_metric([queue, function], tally.cpu[function])
        _add_cost(queue, tally, cost)
        expiries.add_metric([queue], tally.expiries)
        reverts.add_metric([queue], tally.reverts)
        races.add_metric([queue], tally.races)
        wakeups.add_metric([queue], tally.wakeups)
    return [
        up,
        jobs,
        oldest,
        unserved,
        paused,
        managers,
        heartbeat,
        running,
        runs,
        retries,
        dead,
        durations,
        cpu,
        *cost,
        expiries,
        reverts,
        races,
        wakeups,
    ]


def _add_counters(
    queue: str,
    tally: Tally,
    runs: CounterMetricFamily,
    retries: CounterMetricFamily,
    dead: CounterMetricFamily,
    durations: HistogramMetricFamily,
) -> None:
    for function in sorted(tally.functions()):
        for outcome in OUTCOMES:
            count = tally.runs.get((function, outcome), 0)
            if count or outcome == "succeeded":
                runs.add_metric([queue, function, outcome], count)
        retries.add_metric([queue, function], tally.runs.get((function, "retried"), 0))
        dead.add_metric([queue, function], tally.runs.get((function, "dead"), 0))
        histogram = tally.durations.get(function)
        if histogram is not None:
            durations.add_metric([queue, function], _cumulative(DURATION_BUCKETS, histogram.buckets), histogram.total)


class _Cost(NamedTuple):
    """The families of what runs cost, by function, from their records' `cost` (docs/FORMAT.md)."""

    cpu_user: CounterMetricFamily
    cpu_system: CounterMetricFamily
    peak_memory: HistogramMetricFamily
    processes: CounterMetricFamily
    oom_kills: CounterMetricFamily


def _cost_families() -> _Cost:
    """The CPU by mode is two counters beside `forkvisor_run_cpu_seconds_total` (as cAdvisor
    keeps `container_cpu_user_seconds_total` beside its total): a `mode` label on the existing
    one would have changed its series under every query already written. Peak memory is a
    histogram, not a gauge of the largest: runs are events (as their durations are), buckets
    add up across managers and hosts, and a bucket near the limit (or `histogram_quantile`)
    says how close runs come to it, which one all-time maximum cannot."""
    labels = ["queue", "function"]
    return _Cost(
        CounterMetricFamily(
            "forkvisor_run_cpu_user_seconds", "User CPU time of runs (part of forkvisor_run_cpu_seconds)", labels=labels
        ),
        CounterMetricFamily(
            "forkvisor_run_cpu_system_seconds",
            "System CPU time of runs (part of forkvisor_run_cpu_seconds)",
            labels=labels,
        ),
        HistogramMetricFamily(
            "forkvisor_run_peak_memory_bytes",
            "Peak memory of each run: of all its processes at once with a memory cgroup, else of its largest",
            labels=labels,
        ),
        CounterMetricFamily(
            "forkvisor_run_processes",
            "Processes runs started, as many as their cgroups were seen to hold (at least); not counted without one",
            labels=labels,
        ),
        CounterMetricFamily(
            "forkvisor_oom_kills", "Processes of runs the kernel killed at their memory limit", labels=labels
        ),
    )


def _add_cost(queue: str, tally: Tally, cost: _Cost) -> None:
    counters = (
        (cost.cpu_user, tally.cpu_user),
        (cost.cpu_system, tally.cpu_system),
        (cost.processes, tally.processes),
        (cost.oom_kills, tally.oom_kills),
    )
    for family, counts in counters:
        for function in sorted(counts):
            family.add_metric([queue, function], counts[function])
    for function in sorted(tally.peaks):
        peaks = tally.peaks[function]
        cost.peak_memory.add_metric([queue, function], _cumulative(MEMORY_BUCKETS, peaks.buckets), peaks.total)


def _cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """A histogram's buckets as Prometheus has them: each counts what is at most its bound."""
    cumulative, buckets = 0, list[tuple[str, float]]()
    for bound, count in zip(bounds, counts, strict=True):
        cumulative += count
        buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
    return buckets


class _Fixed:
    """A collector that hands out metric families read already."""

    def __init__(self, found: list[Metric]) -> None:
        self.found = found

    def collect(self) -> list[Metric]:
        return self.found


def _registry(found: list[Metric]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)  # only these: not this process's own metrics
    registry.register(_Fixed(found))
    return registry


def render(found: list[Metric]) -> bytes:
    """Metric families in Prometheus' text format."""
    return generate_latest(_registry(found))


def exposition(queues: Sequence[Queue]) -> bytes:
    """The queues' metrics in Prometheus' text format."""
    return render(families(read(queues)))


def write_textfile(queues: Sequence[Queue], path: str) -> None:
    """Write the metrics for node_exporter's textfile collector, whole or not at all."""
    replace_file(Path(path), exposition(queues))


def replace_file(path: Path, data: bytes) -> None:
    """Replace `path` with a file holding `data`, so a reader sees the old file or the new
    one, whole. The new one is written beside it under a random name, made with
    O_EXCL|O_NOFOLLOW (a link or a file planted under any name is never opened: a name one
    could predict once let root overwrite the file a link pointed to), private while it is
    written, fsynced, given `TEXTFILE_MODE`, then renamed over `path` (which replaces a link
    there, never follows it). On failure nothing is left but what was there before."""
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        temporary = f".{path.name}.{secrets.token_hex(8)}.tmp"  # not *.prom: the collector skips it
        fd = os.open(temporary, _NEW_FILE, 0o600, dir_fd=folder)
        try:
            _fill(fd, data)
            os.rename(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            _remove_if_there(temporary, folder)
            raise
        os.fsync(folder)  # the rename, durable
    finally:
        os.close(folder)


def _fill(fd: int, data: bytes) -> None:
    """Write `data` whole into the new file `fd`, let the collector read it, fsync it, close it."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fchmod(fd, TEXTFILE_MODE)
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_if_there(name: str, folder: int) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass  # never made (the open failed), or renamed already
