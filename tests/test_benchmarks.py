"""The benchmarks a newcomer runs in one command still run (tiny sizes: a smoke test,
not a measurement; the figures are in docs/PERFORMANCE.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import (
    commands,
    common,
    heavy,
    keys,
    latency,
    managers,
    pages,
    planning,
    progress,
    references,
    spawning,
    steps,
    throughput,
    web,
)
from benchmarks.tasks import noop, registry
from jobs import Call, Queue, command_call
from supervisor import Manager, forking
from supervisor.spawner import Spawner
from tests.processes import Processes


@pytest.fixture
def disk(tmp_path: Path) -> Path:
    if common.filesystem_type(tmp_path) in common.MEMORY_FILESYSTEMS:
        pytest.skip(f"{tmp_path} is in memory: the benchmarks refuse it")
    return tmp_path


@pytest.fixture
def spawner() -> Spawner:
    found = Spawner.find()
    if found is None:
        pytest.skip("no setpriv with --pdeathsig here: the spawned forms cannot run")
    return found


def test_the_throughput_benchmark_runs(procs: Processes, disk: Path) -> None:
    results = throughput.main(["--dir", str(disk), "--jobs", "10", "--rounds", "1", "--concurrency", "2"])
    assert results["c2-durable"]["recording_queue_vs_minimal_queue"]["median"] > 0
    assert set(results["targets"]) == {"c2-plain >= 0.7 x minimal queue", "c2-durable >= 0.8 x minimal queue"}
    assert set(results["floors"]) == {"c2-plain", "c2-durable"}
    assert results["floors"]["c2-plain"]["median"] > 0


@pytest.mark.parametrize("durable", [False, True])
def test_the_recording_queue_keeps_what_forkvisor_keeps_of_a_job(procs: Processes, disk: Path, durable: bool) -> None:
    queue = references.RecordingQueue(disk / "q")
    queue.fill(3)
    assert queue.run(2, durable) == 3
    for job in queue.done.iterdir():
        run = job / "attempt-1"
        assert (job / "attempts").read_text() == "1\n"
        assert [line.split(" ", 1)[1] for line in (job / "events").read_text().splitlines()] == [
            "claimed: attempt 1/3 (run 1)",
            "done: attempt 1 (run 1) succeeded",
        ]
        assert (job / "result.json").samefile(run / "result.json")
        assert (run / "pid").read_text().strip().isdigit()
        assert (run / "stdout").exists()
        assert (run / "stderr").exists()
        assert '"exit_code": 0' in (run / "outcome.json").read_text()  # (72: its gate did not open)
        assert not [*job.glob(".*"), *run.glob(".*")]  # every staged count and outcome put in place


def _names(job: Path) -> tuple[list[str], list[str]]:
    """The names a done job's folder holds, and its first run's folder."""
    return sorted(entry.name for entry in job.iterdir()), sorted(entry.name for entry in (job / "attempt-1").iterdir())


@pytest.mark.parametrize("kind", ["python", "command"])
def test_the_recording_queues_write_the_files_forkvisor_writes(procs: Processes, disk: Path, kind: str) -> None:
    """File for file, a done job of each recording queue holds what forkvisor's done job holds
    (a floor that skips one of forkvisor's records is no floor)."""
    if kind == "command" and not forking.CAN_VFORK:
        pytest.skip("the C module that vforks command jobs is not built here")
    queue = Queue(disk / "fv")
    queue.enqueue_many([Call(noop) if kind == "python" else command_call([commands.TRUE])])
    Manager(queue, registry, concurrency=1, commands=kind == "command").run(burst=True)
    (done,) = (queue.path / "done").iterdir()
    recording = (references.RecordingQueue if kind == "python" else references.CommandRecordingQueue)(disk / "rec")
    recording.fill(1)
    assert recording.run(1, durable=False) == 1
    (floor,) = recording.done.iterdir()
    assert _names(floor) == _names(done)


def test_the_contained_recording_queue_runs_each_job_in_a_cgroup_of_its_own(procs: Processes, disk: Path) -> None:
    with references.RunCgroups.here() as cgroups:
        if cgroups is None:
            pytest.skip("forkvisor's runs get no cgroup here (not root, or no cgroup delegated)")
        queue = references.RecordingQueue(disk / "q", cgroups)
        queue.fill(3)
        assert queue.run(2, durable=False) == 3
        for job in queue.done.iterdir():
            cost = json.loads((job / "attempt-1" / "outcome.json").read_text())["cost"]
            assert cost["cpu_user"] + cost["cpu_system"] > 0  # its cgroup counted the child's CPU: it was in it
        assert not [entry for entry in os.scandir(cgroups.runs) if entry.is_dir()]  # each removed after its run
    assert not os.path.exists(cgroups.runs)


@pytest.mark.parametrize("durable", [False, True])
def test_the_command_recording_queue_keeps_what_forkvisor_keeps_of_a_command_job(
    procs: Processes, disk: Path, durable: bool
) -> None:
    if not forking.CAN_VFORK:
        pytest.skip("the C module that vforks command jobs is not built here")
    queue = references.CommandRecordingQueue(disk / "q")
    queue.fill(3)
    assert queue.run(2, durable) == 3
    for job in queue.done.iterdir():
        run = job / "attempt-1"
        assert (job / "attempts").read_text() == "1\n"
        assert len((job / "events").read_text().splitlines()) == 2
        assert int((run / "pid").read_text()) > 0
        assert '"exit_code": 0' in (run / "outcome.json").read_text()  # `true` ran
        assert not [*job.glob(".*"), *run.glob(".*")]


def test_the_command_jobs_benchmark_runs(procs: Processes, disk: Path, spawner: Spawner) -> None:
    results = commands.main(["--dir", str(disk), "--jobs", "20", "--rounds", "1"])
    default = commands.ways()[0]
    assert results["c2"][f"{default}_plain_jobs_per_s"]["median"] > 0
    assert results["c2"]["forked_durable_jobs_per_s"]["median"] > 0
    if forking.CAN_VFORK:
        assert results["c2"]["recording_queue_durable_ratio_vs_xargs"]["median"] > 0
    assert set(results["targets"]) == {f"c2 {default} plain >= 0.5 x xargs", f"c2 {default} durable >= 0.5 x xargs"}


def test_the_spawning_benchmark_runs(procs: Processes, spawner: Spawner, capsys: pytest.CaptureFixture[str]) -> None:
    spawning.main(["--jobs", "20", "--rounds", "1"])
    assert "spawn + setpriv + sh" in capsys.readouterr().out


def test_the_heavy_app_benchmark_runs(procs: Processes, disk: Path) -> None:
    results = heavy.main(["--dir", str(disk), "--mb", "8", "--jobs", "10", "--rounds", "1"])
    assert results["buffer"]["forkvisor_jobs_per_s"]["median"] > 0
    assert results["objects"]["forkvisor_durable_jobs_per_s"]["median"] > 0
    assert len(results["targets"]) == 4
    floors = {"buffer", "buffer durable", "objects", "objects durable"}
    assert set(results["floors"]) == floors  # each target's floor, contained where runs get cgroups here
    with references.RunCgroups.here() as cgroups:
        contained = cgroups is not None  # where forkvisor's runs get cgroups here, the floors have them too
    assert all(floor["who"].startswith("contained") == contained for floor in results["floors"].values())
    assert all(floor["median"] > 0 for floor in results["floors"].values())


def test_the_containment_benchmark_runs(procs: Processes, disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import containment as benchmark
    from supervisor.containment import CgroupContainment, detect

    if not isinstance(found := detect(), CgroupContainment):
        pytest.skip(f"no cgroup per run here: {found.describe()}")
    benchmark.main(["--dir", str(disk), "--runs", "4", "--rounds", "1", "--jobs", "4", "--starts", "8", "--gap", "1"])
    out = capsys.readouterr().out
    assert "A run's life with and without a cgroup" in out
    assert "A run's start" in out or "no child is born in its cgroup here" in out


def test_the_steps_benchmark_runs(procs: Processes, disk: Path) -> None:
    if not forking.CAN_VFORK:
        pytest.skip("the C module that vforks command jobs is not built here")
    results = steps.main(["--dir", str(disk), "--jobs", "10", "--rounds", "1"])
    for who in ("forkvisor", "floor"):
        assert results[who]["the turn"]["median"] > 0
        assert results[who]["claim"]["median"] > 0  # each step's clock ran
        assert results[who]["end, records"]["median"] > 0


def test_the_latency_benchmark_runs(procs: Processes, disk: Path) -> None:
    results = latency.main(["--dir", str(disk), "--jobs", "5", "--gap", "1"])
    for who in ("forkvisor", "reference", "recording"):  # the recording server's children stamped their starts
        assert results[who]["enqueue_call_to_start_ms"]["p50"] > 0
    assert set(results["targets"]) == {"enqueue call->start p50 < 3.0 ms", "enqueue call->start p99 < 10.0 ms"}


def test_the_pages_benchmark_runs(procs: Processes, disk: Path) -> None:
    results = pages.main(["--dir", str(disk), "--jobs", "40", "--turns", "10", "--rounds", "1", "--forks", "20"])
    assert results["copied_page"]["us_per_page"]["median"] > 0
    assert results["turns"] == 10
    assert results["pages_per_turn"]["claim: spec, count, run folder, policy, events"] > 0  # a claim writes pages


def test_the_progress_benchmark_runs(disk: Path) -> None:
    results = progress.main(["--dir", str(disk), "--calls", "1000"])
    assert results["progress_us"] > 0


def test_the_keys_benchmark_runs(disk: Path) -> None:
    results = keys.main(["--dir", str(disk), "--keys", "50", "--jobs", "10", "--rounds", "1"])
    assert results["rates"]["50 keys"]["enqueue, fresh key"]["median"] > 0


@pytest.mark.slow
def test_the_web_benchmark_runs(disk: Path) -> None:
    results = web.main(["--dir", str(disk), "--done", "60", "--rounds", "1"])
    assert results["seconds"]["overview"]["median"] > 0


def test_the_planning_benchmark_runs(disk: Path) -> None:
    results = planning.main(
        ["--dir", str(disk), "--schedules", "20", "--waiting", "50", "--jobs", "10", "--rounds", "1", "--fan-in", "5"]
    )
    assert results["rates"]["empty"]["median"] > 0
    assert results["firer"]["first pass s"] > 0


@pytest.mark.slow  # (about 6 s: the default suite stays under ten minutes)
def test_the_many_managers_benchmark_runs(procs: Processes, disk: Path) -> None:
    argv = ["--dir", str(disk), "--jobs", "12", "--rounds", "1", "--managers", "1", "2", "--trickle", "3"]
    results = managers.main(argv)
    assert results["M2"]["jobs_per_s"]["median"] > 0
    assert results["M1"]["races_per_job"]["median"] == 0  # one manager races no one in a burst
    assert set(results["targets"]) == {"races per job at M=2 < 0.2"}
