"""What every benchmark shares: where queues go, statistics, tables, JSON, RSS and CPU.

Queues are made in a fresh folder under `--dir` (default: the system's
temporary folder, unless it is tmpfs, then the repository's parent folder),
and removed afterwards. The file system type is printed with the results:
fsync on tmpfs costs nothing, so figures from it would flatter every
durable path.

The scratch folder gets ext4's top-directory flag (`chattr +T`) where the file
system allows it, so that each queue made in it starts in a block group of its
own, and nothing is deleted until a benchmark ends. Without a journal, ext4
makes creating a file cost up to 25 times more in a block group where many
files were deleted in the last five minutes (`recently_deleted` in the
kernel's inode allocator): by an earlier round, or by anyone else sharing
/tmp. That would measure the neighbours, not forkvisor.
"""

from __future__ import annotations

import argparse
import array
import fcntl
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.files import sync_filesystem

REPO = Path(__file__).resolve().parent.parent
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs"}
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000


# -- where queues live ------------------------------------------------------------


def mount_of(path: Path) -> tuple[str, str]:
    """(device, file system type) of the mount holding `path` (the longest matching mount point)."""
    target = os.path.realpath(path)
    best, found = "", ("unknown", "unknown")
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            device, point, kind = line.split()[:3]
            point = point.replace("\\040", " ")
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(best):
                best, found = point, (device, kind)
    return found


def filesystem_type(path: Path) -> str:
    return mount_of(path)[1]


def describe_filesystem(path: Path) -> str:
    """`ext4 on /dev/vda, journal: no`: whether fsync means a journal commit matters."""
    device, kind = mount_of(path)
    if kind != "ext4":
        return f"{kind} on {device}"
    journal = any(Path("/proc/fs/jbd2").glob(f"{Path(device).name}-*"))
    return f"{kind} on {device}, journal: {'yes' if journal else 'no'}"


def code_version() -> str:
    """The commit measured, and which files of jobs/ and supervisor/ differ from it."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", "jobs", "supervisor"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    modified = [line[3:] for line in changed if line.strip()]
    return commit + (f" + uncommitted {', '.join(modified)}" if modified else "")


def announce(benchmark: str, root: Path) -> None:
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(
        f"{benchmark}: forkvisor {code_version()}; queues under {root} ({describe_filesystem(root)}); "
        f"{os.cpu_count()} CPUs; load {load}"
    )


def choose_root(requested: Path | None) -> Path:
    """The folder to make queues in: `requested`, else /tmp unless it is in memory."""
    if requested is not None:
        root = requested.resolve()
        root.mkdir(parents=True, exist_ok=True)
    else:
        root = Path(tempfile.gettempdir())
        if filesystem_type(root) in MEMORY_FILESYSTEMS:
            root = REPO.parent
    if filesystem_type(root) in MEMORY_FILESYSTEMS:
        raise SystemExit(f"{root} is {filesystem_type(root)}: fsync would cost nothing there; pass --dir on a disk")
    return root


_deferred: list[Path] | None = None  # while `removal_deferred()` runs: scratch folders to remove at its end


@contextmanager
def scratch(root: Path, label: str) -> Iterator[Path]:
    """A fresh folder under `root` (flagged top-directory if possible), removed with
    everything in it afterwards (or at the end of `removal_deferred`)."""
    folder = Path(tempfile.mkdtemp(prefix=f"forkvisor-bench-{label}-", dir=root))
    set_top_directory(folder)
    try:
        yield folder
    finally:
        if _deferred is not None:
            _deferred.append(folder)
        else:
            remove(folder)


def remove(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    sync_filesystem(folder.parent)


@contextmanager
def removal_deferred() -> Iterator[None]:
    """Keep every scratch folder until the end, so no benchmark runs beside fresh deletions."""
    global _deferred
    _deferred = []
    try:
        yield
    finally:
        folders, _deferred = _deferred, None
        for folder in folders:
            remove(folder)


def empty(folder: Path) -> None:
    """Remove everything inside `folder` (between rounds), then sync."""
    for child in folder.iterdir():
        shutil.rmtree(child, ignore_errors=True)
    sync_filesystem(folder)


def set_top_directory(folder: Path) -> bool:
    """Ask ext4 to spread `folder`'s subfolders over fresh block groups; False if refused."""
    flags = _inode_flags(folder)
    if flags is None:
        return False
    return _inode_flags(folder, flags | _FS_TOPDIR_FL) is not None


def is_top_directory(folder: Path) -> bool:
    return bool((_inode_flags(folder) or 0) & _FS_TOPDIR_FL)


def _inode_flags(folder: Path, new: int | None = None) -> int | None:
    """The folder's inode flags (`lsattr`), after setting them to `new` if given; None if refused."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        if new is not None:
            flags[0] = new
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
        return flags[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", type=Path, help="where to make the queues (a disk file system, not tmpfs)")
    parser.add_argument("--full", action="store_true", help="bigger N and more rounds (slower)")


# -- measuring ------------------------------------------------------------------------


def cpu_self() -> float:
    """CPU seconds (user + system) of this process alone, children excluded."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def cpu_children() -> float:
    """CPU seconds (user + system) of this process's children that have been waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rss_mb(pid: int | str = "self") -> float:
    """Resident set size now (VmRSS), in MiB."""
    return _status_kb(pid, "VmRSS") / 1024


def peak_rss_mb(pid: int | str = "self") -> float:
    """Peak resident set size (VmHWM), in MiB."""
    return _status_kb(pid, "VmHWM") / 1024


def _status_kb(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


@dataclass(frozen=True)
class Timed:
    """One timed run: wall seconds, this process's own CPU seconds, its children's,
    and this process's minor page faults (copy-on-write after fork shows there)."""

    wall: float
    cpu: float
    children_cpu: float
    minor_faults: int = 0


def timed(action: Callable[[], object]) -> Timed:
    cpu, children, faults, start = cpu_self(), cpu_children(), minor_faults(), time.perf_counter()
    action()
    return Timed(time.perf_counter() - start, cpu_self() - cpu, cpu_children() - children, minor_faults() - faults)


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: Sequence[float], share: float) -> float:
    """The `share` (0..1) percentile, nearest rank."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median with the spread (min, max) of repeated measurements."""
    return {"median": median(values), "min": min(values), "max": max(values), "n": len(values)}


def spread_text(values: Sequence[float], digits: int = 0) -> str:
    return f"{median(values):,.{digits}f} [{min(values):,.{digits}f}-{max(values):,.{digits}f}]"


# -- reporting --------------------------------------------------------------------------


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A title, then columns: the first left-aligned, the others right-aligned."""
    cells = [[str(h) for h in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for index, row in enumerate(cells):
        first, *others = zip(row, widths, strict=True)
        print("  " + "  ".join([first[0].ljust(first[1]), *(cell.rjust(width) for cell, width in others)]))
        if index == 0:
            print("  " + "  ".join("-" * width for width in widths))


def emit_json(benchmark: str, root: Path, results: dict[str, Any]) -> None:
    """The final line: every figure, machine-readable."""
    document = {
        "benchmark": benchmark,
        "dir": str(root),
        "filesystem": describe_filesystem(root),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "forkvisor": code_version(),
        "load_average": os.getloadavg(),
        "results": rounded(results),
    }
    print(json.dumps(document, default=_json_default))


def _json_default(value: object) -> object:
    return str(value)


def rounded(value: Any) -> Any:
    """Floats to 4 significant digits (NaN to None), through dicts and lists."""
    if isinstance(value, float):
        return None if value != value else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {key: rounded(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(item) for item in value]
    return value


def ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def manager_command(queue: Path, *options: str) -> list[str]:
    """`forkvisor run` on `queue` with the benchmark tasks, concurrency 2, warnings only."""
    app = ["--app", "benchmarks.tasks:registry", "--path", str(REPO), "--concurrency", "2"]
    return [sys.executable, "-m", "supervisor.cli", "--log-level", "WARNING", "run", str(queue), *app, *options]
