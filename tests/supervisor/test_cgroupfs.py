"""cgroup v2 lends a controller only to the children of a cgroup that holds no process
itself: a manager in its delegated cgroup moves into a leaf beside its runs before it
enables `memory` for them (`cgroupfs.lend`). This host's v2 tree offers one controller,
hugetlb, which stands in for memory here: the same rules, on real cgroups, with real
processes moved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor import cgroupfs, containment

MOUNT = containment.cgroup2_mount()
CONTROLLER = "hugetlb"


def _why_not() -> str:
    if MOUNT is None:
        return "no cgroup v2 hierarchy is mounted"
    if os.geteuid() != 0:
        return "making a cgroup to delegate needs root"
    if CONTROLLER.encode() not in (cgroupfs.read(f"{MOUNT}/cgroup.controllers") or b"").split():
        return f"this host's cgroup v2 root offers no {CONTROLLER} controller to stand in for memory"
    return ""


pytestmark = pytest.mark.skipif(bool(_why_not()), reason=_why_not())

LEND = """
import json, os, sys
from supervisor import cgroupfs
own, controller = sys.argv[1], sys.argv[2]
cgroupfs.write(os.path.join(own, "cgroup.procs"), "0")  # as systemd starts a service in its cgroup
base, _ = cgroupfs.divisible(own)
why_not = cgroupfs.lend(own, base, controller)
print(json.dumps({"why_not": why_not, "own": cgroupfs.own(sys.argv[3]), "base": base}))
"""


@pytest.fixture
def delegated() -> Iterator[Path]:
    """A cgroup given the controller, as systemd's `Delegate=yes` gives a service its own."""
    assert MOUNT is not None
    root = Path(MOUNT)
    lent = CONTROLLER in (root / "cgroup.subtree_control").read_text().split()
    if not lent:
        cgroupfs.enable(str(root), CONTROLLER)
    folder = root / f"fvtest-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    try:
        yield folder
    finally:
        _remove_tree(folder)
        if not lent:
            cgroupfs.write(str(root / "cgroup.subtree_control"), f"-{CONTROLLER}")


def _remove_tree(folder: Path) -> None:
    for below in sorted((path for path in folder.rglob("*") if path.is_dir()), key=lambda p: -len(p.parts)):
        _empty(below)
        below.rmdir()
    _empty(folder)
    folder.rmdir()


def _empty(cgroup: Path) -> None:
    """Move what is left in `cgroup` back to the root (the test's processes have ended, or sleep)."""
    assert MOUNT is not None
    for pid in (cgroup / "cgroup.procs").read_text().split():
        try:
            cgroupfs.write(f"{MOUNT}/cgroup.procs", pid)
        except OSError:
            pass  # gone meanwhile


def _lend(own: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", LEND, str(own), CONTROLLER, str(MOUNT)], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_manager_alone_in_its_cgroup_moves_into_a_leaf_and_lends_the_controller_to_its_runs(delegated: Path) -> None:
    found = _lend(delegated)
    assert found["why_not"] == ""
    assert found["own"] == str(delegated)  # its own cgroup is still the delegated one, seen from the leaf
    assert CONTROLLER in (delegated / "cgroup.subtree_control").read_text().split()
    base = delegated / cgroupfs.FOLDER
    assert CONTROLLER in (base / "cgroup.subtree_control").read_text().split()
    owner = base / "h.1.abcdef"
    owner.mkdir()
    cgroupfs.enable(str(owner), CONTROLLER)  # as `Memory.open_owner` does
    run = owner / "job.1"
    run.mkdir()
    assert CONTROLLER in (run / "cgroup.controllers").read_text().split()  # a run's limit can be set


def test_a_cgroup_shared_with_another_process_lends_nothing_and_says_why(delegated: Path) -> None:
    other = subprocess.Popen(["sleep", "60"])
    try:
        cgroupfs.write(str(delegated / "cgroup.procs"), str(other.pid))
        found = _lend(delegated)
    finally:
        other.kill()
        other.wait()
    assert "other processes are in it" in found["why_not"], found


def test_a_controller_not_given_is_said_so(delegated: Path) -> None:
    found = _lend_other(delegated)
    assert "was given no memory controller" in found


def _lend_other(own: Path) -> str:
    base = own / cgroupfs.FOLDER
    base.mkdir()
    return cgroupfs.lend(str(own), str(base), "memory")


CGROUP2 = b"35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,%s\n"
PROC = b"22 1 0:21 / /proc rw,nosuid shared:12 - proc proc rw,favordynmods\n"  # (another file system's words)


@pytest.mark.parametrize(
    ("options", "favored"),
    [(b"nsdelegate,memory_recursiveprot", False), (b"nsdelegate,favordynmods", True), (b"favordynmods", True)],
)
def test_a_cgroup2_mounted_with_favordynmods_is_told_from_one_without(options: bytes, favored: bool) -> None:
    assert cgroupfs.favors_moves(PROC + CGROUP2 % options) is favored
    assert cgroupfs.favors_moves(PROC) is False  # no cgroup2 at all
