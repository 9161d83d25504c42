"""Command jobs started without forking the manager.

A forked child shares every page of the manager copy-on-write, so each page the
manager writes afterwards faults and is copied: hundreds per job, most of the
manager's own cost per job (docs/PERFORMANCE.md). A command job's child needs
nothing of the manager's memory: it only sets up and execs. So the manager
`posix_spawn`s it instead (glibc creates it like vfork: nothing is copied) and
stays its parent, reaping it with its own `wait4` as any job's child.

The guarantees of a forked child are kept by a chain of two small programs the
host already has (docs/DECISIONS.md, "Spawning command jobs"):

    setpriv --pdeathsig KILL -- sh -c CHECK forkvisor-job MANAGER_PID CWD PROGRAM ARGS...

`setpriv` (util-linux) arms the parent-death signal, then `sh` checks that its
parent is still the manager (exit 71 if it died first, as a forked child does),
enters the job's folder (exit 126 if it cannot) and execs the program in the
same process: the pid the manager waits for is the program's. The new process
group, stdin from /dev/null, stdout and stderr in the attempt folder, the
signals at their default and the job's environment are set up by the spawn
itself. Where `setpriv` (or its `--pdeathsig`) is missing, and for jobs run as
their submitter, command jobs are forked as before.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass

from jobs import Claim, Command, run_folder
from supervisor import forking

log = logging.getLogger(__name__)
NAME = "forkvisor-job"  # how sh names itself in its own messages ("forkvisor-job: 1: exec: x: not found")
CHECK = '[ "$PPID" = "$1" ] || exit 71; [ -z "$2" ] || cd -- "$2" || exit 126; shift 2; exec "$@"'


class RunGone(Exception):
    """The run's folder is gone before its process started: a sweeper took the claim back."""


@dataclass(frozen=True)
class Spawner:
    """Starts command jobs through `setpriv` and `sh`, found once."""

    setpriv: str
    sh: str

    @classmethod
    def find(cls) -> Spawner | None:
        """The spawner, if this host's `setpriv` and `sh` run the chain (tried for real, once
        per process: the programs do not change under a running manager)."""
        return _found()

    @classmethod
    def probe(cls) -> Spawner | None:
        """Run the chain once with `true`; None (and why, in the log) if it does not work."""
        setpriv, sh = shutil.which("setpriv"), shutil.which("sh")
        if setpriv is None or sh is None:
            log.info("command jobs are forked: no %s on PATH", "setpriv" if setpriv is None else "sh")
            return None
        spawner = cls(setpriv, sh)
        probe = spawner.argv(os.getpid(), None, ("true",))
        try:
            done = subprocess.run(probe, capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.info("command jobs are forked: %s does not run (%s)", setpriv, exc)
            return None
        if done.returncode != 0:  # an old setpriv (before util-linux 2.33) has no --pdeathsig
            why = done.stderr.decode(errors="replace").strip()[-200:]
            log.info("command jobs are forked: %s --pdeathsig failed (%s)", setpriv, why)
            return None
        return spawner

    def argv(self, manager: int, cwd: str | None, program: tuple[str, ...]) -> list[str]:
        """The chain's words: `program` run by the child of `manager`, in `cwd` (None: where it is)."""
        shell = [self.sh, "-c", CHECK, NAME, str(manager), cwd or ""]
        return [self.setpriv, "--pdeathsig", "KILL", "--", *shell, *program]

    def spawn(self, claim: Claim, command: Command, environment: dict[str, str], file_mode: int) -> int:
        """Start the command job's process; return its pid. RunGone if the run's folder is
        gone (a sweeper took the claim back); OSError if the host cannot spawn."""
        try:
            run = run_folder.open_run(claim)
        except FileNotFoundError:
            raise RunGone(claim.job_id) from None
        opened: list[int] = []  # stdin, stdout, stderr
        try:
            opened.append(_above_stdio(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)))
            for name in run_folder.OUTPUT_FILES:
                opened.append(_above_stdio(run_folder.open_output(run, name, file_mode)))
            stdin, stdout, stderr = opened
            # Absolute, as os.chdir would take it: sh's cd looks a relative one up in $CDPATH.
            cwd = os.path.join(os.getcwd(), command.cwd) if command.cwd else None
            argv = self.argv(os.getpid(), cwd, command.argv)
            pid = forking.spawn(self.setpriv, argv, environment, (stdin, stdout, stderr))
            try:
                run_folder.write_pid(run, file_mode, pid)
            except OSError:
                pass  # only `forkvisor status` reads it; the job runs anyway
            return pid
        finally:
            for fd in [*opened, run]:
                os.close(fd)


@functools.cache
def _found() -> Spawner | None:
    return Spawner.probe()


def _above_stdio(fd: int) -> int:
    """`fd`, moved above 2 if it is one of them (a manager started with stdout closed): the
    spawn's dup2s onto 0, 1 and 2 must not overwrite a descriptor still to be copied."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved
