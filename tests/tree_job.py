"""A job that starts a tree of processes, for the containment tests.

Every process of the tree carries `FVTEST_MARK=MARK` in its environment, or (a Python
fork that never execs: its environment in /proc is its parent's) `fvtest MARK` as its
title; the tests look for them in /proc, knowing nothing of how forkvisor finds a run's
processes. On its first
run the job starts its tree and blocks (or ends, leaving it); on every run it first looks for a process of an
earlier run still alive and writes what it found to LOG, one line per run:

    clean N           no process of an earlier run was alive when run N started
    overlap N PIDS    these were
    up N              run N's tree is set up

As a command job: `python -m tests.tree_job KIND MARK LOG [THEN]` (the command's environment
sets FVTEST_MARK, so the first process is marked too); as a Python job: `sample.tree`
(kinds "subprocess" and "fork").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

MARK_VARIABLE = "FVTEST_MARK"
TREES = {
    "pipeline": ["sh", "-c", "sleep 300 | cat"],  # two processes in the job's group, the shell waits
    "setsid": ["setsid", "sh", "-c", "sleep 300 & exit 0"],  # a new session, its leader gone at once
    "subprocess": ["sleep", "300"],  # what subprocess.run starts from Python
    "daemon": [sys.executable, "-c", "import os,time\nif os.fork(): os._exit(0)\nos.setsid()\ntime.sleep(300)"],
    "fork": [],  # the Python job forks itself, the child leaves the session and never execs (`_fork_away`)
}


def marked(mark: str) -> list[int]:
    """The live processes (zombies carry no environment) whose environment or title holds the mark."""
    wanted, title = f"{MARK_VARIABLE}={mark}".encode(), f"fvtest {mark}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as environ:
                variables = environ.read().split(b"\0")
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                words = cmdline.read().rstrip(b"\0")
        except OSError:
            continue  # gone, or not ours to read
        if wanted in variables or (words == title and variables != [b""]):
            found.append(int(name))
    return found


def run(kind: str, mark: str, log: str, then: str = "block") -> None:
    """Start the tree of `kind`; then block, or (`then` "return") end, leaving it."""
    attempt = int(os.environ["FORKVISOR_ATTEMPT"])
    earlier = marked(mark)
    _append(log, f"overlap {attempt} {earlier}" if earlier else f"clean {attempt}")
    if attempt > 1:
        return
    os.environ[MARK_VARIABLE] = mark  # (a command's first process has it already)
    if kind == "fork":
        _fork_away(mark)
    else:
        tree = subprocess.Popen(TREES[kind], stdin=subprocess.DEVNULL)
        if kind in ("setsid", "daemon"):
            tree.wait()  # the intermediate leaves at once: its child is the escapee
    deadline = time.monotonic() + 10
    while len(marked(mark)) < 1 + (kind == "pipeline") and time.monotonic() < deadline:
        time.sleep(0.01)  # until the tree's processes have exec'd (and carry the mark)
    _append(log, f"up {attempt}")
    while then == "block":
        signal.pause()


def _fork_away(mark: str) -> None:
    """Fork a process that leaves the session and lives on without exec: nothing in its
    environment says which run it is of (as a Python daemon that forks itself)."""
    if os.fork() == 0:
        try:
            os.setsid()
            from setproctitle import setproctitle

            setproctitle(f"fvtest {mark}")
            time.sleep(300)
        finally:
            os._exit(0)


def _append(log: str, line: str) -> None:
    with open(log, "a", encoding="utf-8") as file:
        file.write(line + "\n")


if __name__ == "__main__":
    run(*sys.argv[1:5])
