"""A real one-node Slurm for the deployment tests (issue 19), in the test's
temporary folder: munged (started if none answers), `slurmctld -D` and
`slurmd -D` on free ports with a private slurm.conf and cgroup.conf (found through
SLURM_CONF; nothing is written to /etc), no accounting; once with
`proctrack/linuxproc`, once with `proctrack/cgroup` (cgroup v1). Skipped, saying
why, where Slurm is not installed (apt: slurmctld slurmd slurm-client munge), the
tests do not run as root, or (for cgroup) there is no cgroup v1 freezer.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_until

NEEDED = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo", "munged", "munge")


def _why_no_slurm() -> str | None:
    missing = [tool for tool in NEEDED if shutil.which(tool) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing; apt: slurmctld slurmd slurm-client munge)"
    if os.geteuid() != 0:
        return "a private Slurm cluster needs root (slurmd starts jobs as their users)"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _munge_answers() -> bool:
    encoded = subprocess.run(["munge", "-n"], capture_output=True, check=False)
    return encoded.returncode == 0


@pytest.fixture(scope="module")
def munged() -> Iterator[None]:
    """The munge daemon Slurm authenticates with: the one that answers, or one started
    here and stopped when this module's tests end (later tests must not find it as a
    leftover child of this process)."""
    why = _why_no_slurm()
    if why:
        pytest.skip(why)
    if _munge_answers():
        yield
        return
    subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "/run/munge"], check=True)
    daemon = subprocess.Popen(["runuser", "-u", "munge", "--", "munged", "-F"], start_new_session=True)
    try:
        wait_until(_munge_answers, 10, "munged answered")
        yield
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)  # runuser and munged
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=10)


@dataclass(frozen=True)
class Cluster:
    folder: Path
    environment: dict[str, str]

    def run(self, *command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, env=self.environment, timeout=30, check=False)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done.stdout

    def states(self, job: str) -> list[str]:
        """The state of each task of an array job (`squeue -j` alone hides finished ones)."""
        out = self.run("squeue", "-r", "-t", "all", "-h", "-j", job, "-o", "%T")
        return out.split()


def _config(folder: Path, node: str, proctrack: str) -> str:
    control, daemon = _free_ports(2)
    return f"""ClusterName=fvtest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={control}
SlurmdPort={daemon}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/{proctrack}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
KillWait=10
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
NodeName={node} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=main Nodes={node} Default=YES MaxTime=INFINITE State=UP
"""


FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture(params=["linuxproc", "cgroup"])
def slurm(tmp_path: Path, request: pytest.FixtureRequest, munged: None) -> Iterator[Cluster]:
    """A cluster tracking processes by their parentage (linuxproc) or by cgroup (v1)."""
    proctrack = request.param
    if proctrack == "cgroup" and not FREEZER.is_dir():
        pytest.skip("proctrack/cgroup needs the cgroup v1 freezer (/sys/fs/cgroup/freezer)")
    folder = tmp_path / "slurm"
    for sub in ("state", "spool", "logs"):
        (folder / sub).mkdir(parents=True)
    node = socket.gethostname().split(".")[0]
    (folder / "slurm.conf").write_text(_config(folder, node, proctrack))
    (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")
    environment = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
    daemons = [
        _start(["slurmctld", "-D"], folder / "slurmctld.out", environment),
        _start(["slurmd", "-D", "-N", node], folder / "slurmd.out", environment),
    ]
    cluster = Cluster(folder, environment)
    try:
        wait_until(lambda: _idle(cluster), 30, "the Slurm node was idle")
        yield cluster
    finally:
        _stop(cluster, daemons)
        _remove_tree(FREEZER / f"slurm_{node}")  # Slurm leaves its freezer cgroup behind


def _remove_tree(cgroup: Path) -> None:
    """Remove an empty cgroup and its children, deepest first (cgroups are removed with rmdir)."""
    if not cgroup.is_dir():
        return
    for child in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        child.rmdir()
    cgroup.rmdir()


def _stop(cluster: Cluster, daemons: list[subprocess.Popen[bytes]]) -> None:
    """Cancel what is left, let Slurm end its steps, then stop the daemons."""
    subprocess.run(["scancel", "-u", "root"], env=cluster.environment, capture_output=True, check=False)
    try:
        wait_until(lambda: not _active(cluster), 30, "Slurm ended every job step")
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(timeout=10)


def _active(cluster: Cluster) -> bool:
    states = "pending,running,completing,suspended"
    done = subprocess.run(
        ["squeue", "-h", "-t", states], capture_output=True, text=True, env=cluster.environment, check=False
    )
    return done.returncode == 0 and bool(done.stdout.strip())


def _start(command: list[str], log: Path, environment: dict[str, str]) -> subprocess.Popen[bytes]:
    """A daemon in the foreground (-D), killed with this process if it dies first."""
    with open(log, "wb") as output:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            ["setpriv", "--pdeathsig", "KILL", *command], env=environment, stdout=output, stderr=subprocess.STDOUT
        )


def _idle(cluster: Cluster) -> bool:
    done = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=cluster.environment)
    return done.returncode == 0 and done.stdout.strip() == "idle"


def wait_for_tasks(cluster: Cluster, job: str, states: set[str], timeout: float, what: str) -> None:
    """Until every task of array job `job` is in one of `states`."""

    def reached() -> bool:
        found = cluster.states(job)
        return bool(found) and set(found) <= states

    wait_until(reached, timeout, what)
