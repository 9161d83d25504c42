"""What runs cost, counted per function in the stats files (`jobs.stats`): CPU by mode, peak
memory as a histogram, processes; files of older managers (which have none of these) still
read and are counted on from; a malformed new field makes the file unreadable, as any."""

from __future__ import annotations

import json

import pytest

from jobs import InvalidJob, Owner, Queue, RunCost, Tally
from jobs.stats import MEMORY_BUCKETS

MIB = 1 << 20
# A stats file as managers wrote it before the cost by mode, peak and processes were counted.
OLDER_FILE = {
    "kind": "forkvisor-stats",
    "version": 1,
    "runs": [["f", "succeeded", 2]],
    "durations": {"f": {"buckets": [0, 2, *[0] * 11], "sum": 0.06}},
    "cpu": {"f": 1.5},
    "oom_kills": {},
    "reverts": 0,
    "expiries": 0,
}


def test_the_cost_of_runs_is_counted_by_function_and_survives_its_json() -> None:
    tally = Tally()
    tally.run_ended("f", "succeeded", 0.1, RunCost(0.5, 0.25, 100 * MIB, 3))
    tally.run_ended("f", "dead", 0.1, RunCost(1.0, 0.5, 20 * MIB, 1, oom_kills=1))
    tally.run_ended("f", "succeeded", 0.1, RunCost(0.1, 0.1))  # no peak, no count: measured by nothing
    tally.run_ended("g", "succeeded", 0.1, RunCost(0.1, 0.1))
    again = Tally.from_json(json.loads(json.dumps(tally.to_json())))
    assert again == tally
    assert again.cpu == {"f": pytest.approx(2.45), "g": pytest.approx(0.2)}, "the total older readers read"
    assert again.cpu_user == {"f": pytest.approx(1.6), "g": pytest.approx(0.1)}
    assert again.cpu_system == {"f": pytest.approx(0.85), "g": pytest.approx(0.1)}
    assert again.processes == {"f": 4}, "g's runs were not counted: none, not 0"
    assert again.oom_kills == {"f": 1}
    assert "g" not in again.peaks
    peaks = again.peaks["f"]
    assert peaks.count == 2, "a run whose peak nobody measured is not a run of 0 bytes"
    assert peaks.total == 120 * MIB
    assert peaks.buckets[MEMORY_BUCKETS.index(32 * MIB)] == 1  # 20 MiB: at most 32 MiB
    assert peaks.buckets[MEMORY_BUCKETS.index(128 * MIB)] == 1  # 100 MiB: at most 128 MiB


def test_the_cost_of_a_record_without_a_count_of_processes() -> None:
    """A cost read by wait4 (no cgroup) has no `processes_seen` and no OOM kills."""
    cost = RunCost.of({"cpu_user": 0.5, "cpu_system": 0.25, "peak_memory": 5 * MIB, "oom_kills": None})
    assert cost == RunCost(0.5, 0.25, 5 * MIB, None, 0)
    seen = RunCost.of({"cpu_user": 0, "cpu_system": 0, "peak_memory": None, "oom_kills": 2, "processes_seen": 4})
    assert (seen.peak_memory, seen.processes, seen.oom_kills) == (None, 4, 2)


def test_subtracting_a_tally_takes_its_cost_out_too() -> None:
    """What a manager whose file was adopted under it does (`StatsFile.write`)."""
    written, later = Tally(), Tally()
    written.run_ended("f", "succeeded", 1.0, RunCost(1.0, 2.0, 300 * MIB, 5))
    later.add(written)
    assert later.peaks["f"].total == 300 * MIB
    later.run_ended("f", "succeeded", 1.0, RunCost(0.5, 0.5, 10 * MIB, 2))
    later.add(written, sign=-1)
    assert later.cpu_user == {"f": 0.5}
    assert later.cpu_system == {"f": 0.5}
    assert later.processes == {"f": 2}
    assert later.peaks["f"].count == 1
    assert later.peaks["f"].total == 10 * MIB


def test_an_older_managers_file_reads_and_is_counted_on(queue: Queue) -> None:
    """Its total CPU stands; the split, peaks and processes start from none."""
    older = Tally.from_json(OLDER_FILE)
    assert older.cpu == {"f": 1.5}
    assert (older.cpu_user, older.cpu_system, older.peaks, older.processes) == ({}, {}, {}, {})
    (queue.path / "stats" / "manager.gone-host.json").write_text(json.dumps(OLDER_FILE))
    adopter = queue.serving.stats_file("manager")
    owner = Owner.new()
    queue.serving.register_owner(owner)
    adopter.start(owner.name)
    adopter.tally.run_ended("f", "succeeded", 0.02, RunCost(0.25, 0.25, 64 * MIB, 2))
    adopter.write(owner.name)
    total = queue.stats()
    assert total.runs == {("f", "succeeded"): 3}
    assert total.cpu == {"f": 2.0}
    assert total.cpu_user == {"f": 0.25}
    assert total.processes == {"f": 2}
    assert total.peaks["f"].count == 1


@pytest.mark.parametrize(
    "field",
    [
        {"cpu_user": {"f": -1}},
        {"cpu_system": {"f": "many"}},
        {"cpu_system": []},
        {"processes": {"f": 1.5}},
        {"processes": {"f": True}},
        {"peak_memory": {"f": {"buckets": [1], "sum": 1}}},
        {"peak_memory": {"f": {"buckets": [-1] + [0] * 12, "sum": 1}}},
        {"peak_memory": {"f": {"buckets": [0] * 13}}},
    ],
)
def test_a_malformed_cost_field_is_refused(field: dict[str, object]) -> None:
    with pytest.raises(InvalidJob):
        Tally.from_json({**OLDER_FILE, **field})
