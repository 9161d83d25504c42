"""Prometheus metrics from the queue folder: real managers run jobs, `forkvisor metrics`
reads them (as text, and as node_exporter's textfile), the counters survive a manager's
restart and a SIGKILL, and the sweeper counts what it takes back."""

from __future__ import annotations

import os
import re
import signal
import stat
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs import Queue, State
from supervisor import metrics
from tests import sample_jobs
from tests.cli.conftest import cli, ok, refused
from tests.conftest import REPO, wait_until
from tests.processes import Processes

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    """Each sample by (name, sorted labels), the queue label left out."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "queue"))
            found[(sample.name, labels)] = sample.value
    return found


def _metrics(queue: Queue) -> Samples:
    return _samples(ok("metrics", queue.path).out)


def test_metrics_count_runs_by_function_and_outcome(procs: Processes, queue: Queue, tmp_path: Path) -> None:
    ids = [queue.enqueue(sample_jobs.ok, n) for n in range(3)]
    ids.append(queue.with_options(max_attempts=2, backoff="fixed 0").enqueue(sample_jobs.fail, "twice"))
    ids.append(queue.with_options(delay=3600).enqueue(sample_jobs.ok, "later"))
    manager = procs.manager(queue)
    wait_until(lambda: queue.counts()["done"] == 3 and queue.counts()["dead"] == 1, 15, "the jobs ran", manager=manager)
    manager.close()
    found = _metrics(queue)
    assert found[("forkvisor_runs_total", (("function", "sample.ok"), ("outcome", "succeeded")))] == 3
    assert found[("forkvisor_runs_total", (("function", "sample.fail"), ("outcome", "retried")))] == 1
    assert found[("forkvisor_runs_total", (("function", "sample.fail"), ("outcome", "dead")))] == 1
    assert found[("forkvisor_retries_total", (("function", "sample.fail"),))] == 1
    assert found[("forkvisor_dead_total", (("function", "sample.fail"),))] == 1
    assert found[("forkvisor_run_duration_seconds_count", (("function", "sample.ok"),))] == 3
    assert found[("forkvisor_run_cpu_seconds_total", (("function", "sample.ok"),))] >= 0
    assert found[("forkvisor_run_duration_seconds_bucket", (("function", "sample.ok"), ("le", "+Inf")))] == 3
    assert found[("forkvisor_jobs", (("state", "done"),))] == 3
    assert found[("forkvisor_jobs", (("state", "dead"),))] == 1
    assert found[("forkvisor_jobs", (("state", "scheduled"),))] == 1
    assert found[("forkvisor_managers_alive", ())] == 0  # closed
    assert found[("forkvisor_queue_up", ())] == 1
    for (name, labels), _ in found.items():
        assert all(key != "job_id" and not value.startswith("2026") for key, value in labels), (name, labels)


def test_the_oldest_wait_and_live_managers_are_gauges(procs: Processes, queue: Queue) -> None:
    manager = procs.manager(queue)
    wait_until(lambda: _metrics(queue)[("forkvisor_managers_alive", ())] == 1, 10, "the manager shows", manager=manager)
    owner = manager.owner.name
    found = _metrics(queue)
    assert ("forkvisor_manager_heartbeat_age_seconds", (("owner", owner),)) in found
    queue.pause()
    queue.enqueue(sample_jobs.ok, "waits")
    manager.step(0.3)
    found = _metrics(queue)
    assert found[("forkvisor_paused", ())] == 1
    assert found[("forkvisor_oldest_ready_age_seconds", ())] >= 0
    assert found[("forkvisor_jobs", (("state", "ready"),))] == 1


@pytest.mark.slow
def test_counters_survive_a_restart_and_a_sigkill(procs: Processes, queue: Queue) -> None:
    """A manager killed with SIGKILL loses at most what it counted since its last write;
    the next manager adopts its file, and the sum never goes down."""
    first = procs.run_manager(queue, name="first")
    for n in range(4):
        queue.enqueue(sample_jobs.ok, n)
    wait_until(lambda: queue.counts()["done"] == 4, 15, "the first jobs ran")
    wait_until(lambda: queue.stats().runs.get(("sample.ok", "succeeded")) == 4, 15, "the counts were written")
    os.kill(first.pid, signal.SIGKILL)
    procs.wait_exit(first, 10, "the first manager died")
    second = procs.run_manager(queue, name="second")
    for n in range(2):
        queue.enqueue(sample_jobs.ok, n)
    wait_until(lambda: queue.counts()["done"] == 6, 20, "the next jobs ran")
    wait_until(lambda: queue.stats().runs.get(("sample.ok", "succeeded")) == 6, 20, "the counts add up")
    wait_until(lambda: queue.stats().expiries == 1, 20, "the second one's sweeper reaped the first")
    second.send_signal(signal.SIGTERM)
    assert procs.wait_exit(second, 15, "the second manager drained") == 0
    assert queue.stats().runs[("sample.ok", "succeeded")] == 6
    third = procs.run_manager(queue, "--burst", name="third")  # adopts a gone manager's file
    assert procs.wait_exit(third, 15, "the third manager found nothing to do") == 0
    managers = [name for name in os.listdir(queue.path / "stats") if name.startswith("manager.")]
    assert len(managers) == 2, managers  # three managers ran, two of them at once
    assert queue.stats().runs[("sample.ok", "succeeded")] == 6


def test_a_sweeper_counts_the_claims_it_takes_back(procs: Processes, queue: Queue, barriers: Path) -> None:
    started = barriers / "started"
    job_id = queue.with_options(max_attempts=3).enqueue(sample_jobs.block_once, str(started))
    victim = procs.run_manager(queue, name="victim")
    wait_until(started.exists, 15, "the job started")
    os.kill(victim.pid, signal.SIGKILL)
    procs.wait_exit(victim, 10, "the victim died")
    rescuer = procs.manager(queue)
    wait_until(lambda: queue.job(job_id).state is State.DONE, 20, "the job ran again", manager=rescuer)
    wait_until(lambda: queue.stats().reverts == 1, 10, "the sweeper wrote its count", manager=rescuer)
    found = _metrics(queue)
    assert found[("forkvisor_lease_reverts_total", ())] == 1
    assert found[("forkvisor_lease_expiries_total", ())] == 1


def test_the_textfile_is_written_whole_and_alone(queue: Queue, tmp_path: Path) -> None:
    out = tmp_path / "collector" / "forkvisor.prom"
    out.parent.mkdir()
    ok("metrics", queue.path, "--textfile", out)
    assert os.listdir(out.parent) == ["forkvisor.prom"]  # no temporary file left beside it
    assert _samples(out.read_text())[("forkvisor_queue_up", ())] == 1
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # node_exporter reads it as its own user


def _plant(link: Path, victim: Path) -> None:
    link.unlink(missing_ok=True)
    link.symlink_to(victim)


def test_the_textfile_never_writes_through_a_link_planted_beside_it_or_at_it(queue: Queue, tmp_path: Path) -> None:
    """Whoever may write the collector's folder plants links where the writer will open a
    file: at a temporary name it can predict (prometheus_client's was PATH.PID.THREAD, and
    root overwrote the file such a link pointed to), and at PATH itself. None is followed:
    the temporary file is new (O_EXCL|O_NOFOLLOW) under a random name, and the rename
    replaces a link at PATH. Run as root in CI, where it matters most."""
    victim = tmp_path / "victim"
    victim.write_text("only root may write this\n")
    victim.chmod(0o600)
    folder = tmp_path / "collector"
    folder.mkdir()
    out = folder / "forkvisor.prom"
    predictable = [
        f"{out.name}.{os.getpid()}.{threading.get_ident()}",  # the old name, for a write from this thread
        f".{out.name}.tmp",
        f"{out.name}.tmp",
        f"{out.name}.new",
    ]
    for name in [*predictable, out.name]:
        _plant(folder / name, victim)
    metrics.write_textfile([queue], str(out))  # in this process: the pid and thread the old name used
    _plant(out, victim)
    ok("metrics", queue.path, "--textfile", out)  # and the command, with a link at PATH again
    assert victim.read_text() == "only root may write this\n"
    assert not out.is_symlink()
    assert _samples(out.read_text())[("forkvisor_queue_up", ())] == 1
    assert sorted(os.listdir(folder)) == sorted([*predictable, out.name])  # nothing else left behind
    assert all((folder / name).is_symlink() for name in predictable)  # untouched


def test_a_textfile_that_cannot_be_written_leaves_nothing_behind(queue: Queue, tmp_path: Path) -> None:
    folder = tmp_path / "collector"
    (folder / "forkvisor.prom" / "in-the-way").mkdir(parents=True)  # the rename over PATH fails
    refused(cli("metrics", queue.path, "--textfile", folder / "forkvisor.prom"), 111, "cannot write the textfile")
    assert os.listdir(folder) == ["forkvisor.prom"]  # the temporary file was removed
    missing = tmp_path / "no-such-folder" / "forkvisor.prom"
    refused(cli("metrics", queue.path, "--textfile", missing), 111, "cannot write the textfile", "folder must exist")


def test_metrics_of_several_queues_and_a_refusal(tmp_path: Path) -> None:
    first, second = Queue(tmp_path / "a"), Queue(tmp_path / "b")
    first.enqueue(sample_jobs.ok, 1)
    text = ok("metrics", first.path, second.path).out
    ready = [
        (sample.labels["queue"], sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "forkvisor_jobs" and sample.labels["state"] == "ready"
    ]
    assert sorted(ready) == [(str(first.path), 1), (str(second.path), 0)]
    refused(cli("metrics", first.path, "--every", "5s"), 2, "--every", "--textfile")


def test_the_example_alert_rules_name_only_metrics_that_exist(queue: Queue) -> None:
    rules = (REPO / "examples" / "alerts.yml").read_text()
    named = set(re.findall(r"\bforkvisor_[a-z_]+", rules))
    exposed = set(re.findall(r"^# TYPE (forkvisor_[a-z_]+) ", ok("metrics", queue.path).out, re.M))
    assert named, rules
    assert named <= exposed, named - exposed
    assert rules.count("- alert:") >= 5
