"""What a run cost, where users read it: `forkvisor show --json`, the page's job JSON (and the
page's own words for it) and `/metrics` by function. A real manager runs a shell that starts
a Python process holding 48 MiB and burning CPU, and a `sleep`; with a cgroup per run (every
process counted, skipped with the reason where this process may not make one) and without
(wait4: what the shell waited for; no count of processes)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs import Queue, State
from supervisor import containment
from supervisor.containment import CgroupContainment
from tests.cli.conftest import ok
from tests.conftest import REPO
from tests.processes import Processes, wait_until
from tests.supervisor.test_web import runtime, start_web, stop  # noqa: F401  (runtime: the servers' token folder, autouse)

MIB = 1 << 20
HELD = 48 * MIB
# Touches every byte (b"x" * n writes them: resident, unlike a calloc'd bytearray), burns
# 0.3 s of user CPU (user only: the page faults are system time), and lives long enough to be
# seen by the manager's looks (twice a second).
WORK = (
    f"import os, time\nx = b'x' * {HELD}\nend = os.times().user + 0.3\n"
    "while os.times().user < end: pass\ntime.sleep(1.2)"
)
SCRIPT = f'{sys.executable} -c "{WORK}" & sleep 1.5 & wait'  # sh, python, sleep: 3 processes
FUNCTION = "forkvisor.command"


def _why_no_cgroup() -> str:
    found = containment.detect()
    if not isinstance(found, CgroupContainment):
        return found.describe()
    return "" if found.memory is not None else found.why_no_memory


WHY_NO_CGROUP = _why_no_cgroup()


def _run(procs: Processes, queue: Queue, containment_mode: str) -> str:
    """The job, run to its end by a real manager that then stops (and writes its counters)."""
    job_id = queue.enqueue_command(["sh", "-c", SCRIPT], max_attempts=1)
    manager = procs.run_manager(queue, "--commands", "--containment", containment_mode, name="manager")
    wait_until(lambda: queue.job(job_id).state is State.DONE, 30, "the job is done")
    manager.send_signal(signal.SIGTERM)
    assert procs.wait_exit(manager, 10, "the manager") == 0, procs.log(manager)
    return job_id


def _shown_cost(queue: Queue, job_id: str) -> dict[str, Any]:
    """The cost `forkvisor show --json` gives for the job's last run."""
    shown = json.loads(ok("show", queue.path, job_id, "--json").out)
    cost: dict[str, Any] = shown["history"][-1]["outcome"]["cost"]
    assert isinstance(cost["cpu_user"], float), cost
    assert isinstance(cost["cpu_system"], float), cost
    assert cost["cpu_user"] >= 0.25, "the 0.3 s the Python process burned"
    assert cost["cpu_user"] + cost["cpu_system"] < 10, cost
    assert HELD <= cost["peak_memory"] < 1024 * MIB, cost
    return cost


def _metrics(queue: Queue) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`forkvisor metrics` by (name, labels without the queue)."""
    found = {}
    for family in text_string_to_metric_families(ok("metrics", queue.path).out):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "queue"))
            found[(sample.name, labels)] = sample.value
    return found


def _check_metrics(queue: Queue, cost: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """One run: each counter is its record's figure, the peak one observation in its bucket."""
    found = _metrics(queue)
    by_function = (("function", FUNCTION),)
    assert found[("forkvisor_run_cpu_user_seconds_total", by_function)] == pytest.approx(cost["cpu_user"])
    assert found[("forkvisor_run_cpu_system_seconds_total", by_function)] == pytest.approx(cost["cpu_system"])
    total = found[("forkvisor_run_cpu_seconds_total", by_function)]
    assert total == pytest.approx(cost["cpu_user"] + cost["cpu_system"]), "the existing total, as it was"
    assert found[("forkvisor_run_peak_memory_bytes_count", by_function)] == 1
    assert found[("forkvisor_run_peak_memory_bytes_sum", by_function)] == cost["peak_memory"]
    assert found[("forkvisor_run_peak_memory_bytes_bucket", (*by_function, ("le", "16777216.0")))] == 0
    assert found[("forkvisor_run_peak_memory_bytes_bucket", (*by_function, ("le", "1073741824.0")))] == 1
    return found


def _page_cost(procs: Processes, queue: Queue, job_id: str) -> Any:
    """The job's last run's cost as the page's JSON (`/api/job`) gives it."""
    server, web = start_web(procs, queue.path)
    page = web.json(f"/api/job?queue=0&id={job_id}")
    stop(procs, server)
    return page["history"][-1]["outcome"]["cost"]


def _page_words(cost: dict[str, Any]) -> str:
    """What the page's own script (app.js `costText`) says of `cost`, run by node."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node here to run the page's script")
    script = (REPO / "supervisor" / "static" / "app.js").read_text()
    functions = re.findall(r"^function (?:megabytes|costText)\(.*?^}$", script, re.M | re.S)
    assert len(functions) == 2, "app.js no longer has megabytes and costText"
    program = "\n".join(functions) + f"\nprocess.stdout.write(costText({json.dumps(cost)}, null));"
    return subprocess.run([node, "-e", program], capture_output=True, text=True, check=True, timeout=30).stdout


@pytest.mark.skipif(bool(WHY_NO_CGROUP), reason=WHY_NO_CGROUP or "-")
def test_the_cost_of_every_process_is_shown_everywhere(procs: Processes, queue: Queue) -> None:
    job_id = _run(procs, queue, "cgroup")
    cost = _shown_cost(queue, job_id)
    assert cost["from"] == "cgroup", cost
    assert cost["oom_kills"] == 0, cost
    assert cost["processes_seen"] >= 3, "sh, python and sleep, each alive across two looks"
    found = _check_metrics(queue, cost)
    assert found[("forkvisor_run_processes_total", (("function", FUNCTION),))] == cost["processes_seen"]
    assert _page_cost(procs, queue, job_id) == cost
    words = _page_words(cost)
    assert f"cpu {cost['cpu_user']:.2f} s user, {cost['cpu_system']:.2f} s system" in words, words
    assert f"peak memory {cost['peak_memory'] / MIB:.1f} MiB," in words, words
    assert f"{cost['processes_seen']} processes seen (at least)" in words, words
    assert words.endswith("(every process of the run)"), words


def test_without_a_cgroup_the_cost_is_what_wait4_saw(procs: Processes, queue: Queue) -> None:
    """The shell waited for both: their CPU is in its rusage, their peak is its largest
    process's; the processes are not counted, and /metrics says nothing rather than 0."""
    job_id = _run(procs, queue, "processes")
    cost = _shown_cost(queue, job_id)
    assert cost["from"] == "wait4", cost
    assert "processes_seen" not in cost, cost
    found = _check_metrics(queue, cost)
    assert ("forkvisor_run_processes_total", (("function", FUNCTION),)) not in found
    assert _page_cost(procs, queue, job_id) == cost
    words = _page_words(cost)
    assert f"peak memory {cost['peak_memory'] / MIB:.1f} MiB (its largest process)" in words, words
    assert "processes seen" not in words, words
    assert "every process" not in words, words
