"""forkvisor under a real Slurm (issue 19): an array of managers on one queue does
every job once; a `scancel` mid-work reaches every manager, loses nothing, starts
nothing after it, and uses up no attempt. The scripts are the recipes' own shape
(`exec forkvisor run`, a drain timeout shorter than KillWait)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path

from jobs import Queue, State
from tests import sample_jobs
from tests.conftest import REPO, wait_until
from tests.processes import forkvisor_command
from tests.slurm.conftest import Cluster, wait_for_tasks

MANAGERS = 3


def array_script(cluster: Cluster, queue: Queue, name: str, *options: str) -> Path:
    """A batch script for an array of managers on `queue`, in the shape of examples/slurm."""
    [forkvisor] = forkvisor_command()[:1]
    script = cluster.folder / f"{name}.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --array=1-{MANAGERS}\n"
        "#SBATCH --cpus-per-task=1\n"
        f"#SBATCH --output={cluster.folder}/logs/{name}-%A_%a.log\n"
        f"cd {REPO}\n"
        f"exec {forkvisor} run {queue.path} --app tests.sample_jobs:registry --path {REPO} --concurrency 1 "
        f"{' '.join(options)}\n"
    )
    return script


def submit(cluster: Cluster, script: Path) -> str:
    return cluster.run("sbatch", "--parsable", str(script)).strip().split(";")[0]


def test_a_burst_array_does_every_job_once(slurm: Cluster, tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue")
    ids = [queue.enqueue(sample_jobs.ok, n) for n in range(60)]
    job = submit(slurm, array_script(slurm, queue, "burst", "--burst", "--drain-timeout", "5s"))
    wait_for_tasks(slurm, job, {"COMPLETED"}, 120, "every manager of the array finished")
    assert [queue.job(job_id).state for job_id in ids] == [State.DONE] * len(ids)
    assert {queue.job(job_id).attempts for job_id in ids} == {1}


def test_scancel_drains_every_manager_and_costs_no_attempt(slurm: Cluster, tmp_path: Path) -> None:
    queue = Queue(tmp_path / "queue")
    queue.configure(lease=5)
    ids = [queue.enqueue(sample_jobs.nap, 60) for _ in range(20)]
    options = ("--drain-timeout", "3s", "--kill-grace", "1s")
    job = submit(slurm, array_script(slurm, queue, "workers", *options))
    wait_until(lambda: queue.counts()["claimed"] == MANAGERS, 60, "every manager of the array ran a job")
    cancelled = datetime.datetime.now(datetime.UTC)
    slurm.run("scancel", job)
    wait_for_tasks(slurm, job, {"CANCELLED"}, 60, "every task of the array ended")
    wait_until(lambda: queue.counts()["claimed"] == 0, 30, "every claim went back")

    logs = sorted((slurm.folder / "logs").glob(f"workers-{job}_*.log"))
    assert len(logs) == MANAGERS
    for log in logs:
        assert "draining (SIGTERM)" in log.read_text(), f"{log.name}: the cancel did not reach its manager"
    jobs = [queue.job(job_id) for job_id in ids]
    assert [found.state for found in jobs] == [State.READY] * len(ids), "nothing lost, nothing finished"
    assert [found.attempts for found in jobs] == [0] * len(ids), "the cancel used up attempts"
    for found in jobs:
        for run in found.history:
            assert (run.outcome or {}).get("released") is True, run.outcome
    for found in jobs:  # no manager claimed anything once the cancel came
        for line in (found.path / "events").read_text().splitlines():
            when, what = line.split(" ", 1)
            if what.startswith("claimed by"):
                assert _time(when) < cancelled, f"job {found.id} was claimed after the cancel: {line}"


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(re.sub(r"Z$", "+00:00", stamp))
