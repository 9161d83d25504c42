"""Command jobs started without forking the manager.

A forked child shares every page of the manager copy-on-write, so each page the
manager writes afterwards faults and is copied: hundreds per job, most of the
manager's own cost per job (docs/PERFORMANCE.md). A command job's child needs
nothing of the manager's memory: it only sets up and execs. So the manager starts
it without a fork and stays its parent, reaping it with its own `wait4` as any
job's child. Two ways, the first the host allows (docs/DECISIONS.md, "Command
jobs are spawned, not forked"):

- `Vforked`: the small C module `supervisor/_vfork.c` (built at install where a C
  compiler is at hand, and in the wheels) vforks and, in the child, does what a
  forked child does before it execs: process group, parent-death signal and the
  check that the manager still lives, stdio, the job's folder, signals.
- `Chained`: `posix_spawn` of a chain of two programs every Debian-like host has,

      setpriv --pdeathsig KILL -- sh -c CHECK forkvisor-job MANAGER_PID CWD PROGRAM ARGS...

  `setpriv` (util-linux) arms the parent-death signal, then `sh` checks that its
  parent is still the manager (exit 71 if it died first, as a forked child does),
  enters the job's folder (exit 126 if it cannot) and execs the program in the same
  process. The new process group, stdio and the signals are set by the spawn.

Either way the pid the manager waits for is the program's. Where neither works, and
for jobs run as their submitter, command jobs are forked as before.
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
from supervisor.errors import RunGone
from supervisor.forking import NO_CGROUPS, Cgroups

log = logging.getLogger(__name__)
NAME = "forkvisor-job"  # how sh names itself in its own messages ("forkvisor-job: 1: exec: x: not found")
CHECK = '[ "$PPID" = "$1" ] || exit 71; [ -z "$2" ] || cd -- "$2" || exit 126; shift 2; exec "$@"'


class Spawner:
    """Starts command jobs without a fork: the run's files here, the process in a subclass."""

    @classmethod
    def find(cls) -> Spawner | None:
        """The way this host allows, tried for real once per process (the programs and the
        module do not change under a running manager); None: command jobs are forked."""
        return _found()

    enters_cgroup = False  # whether its process can enter the run's cgroup before the program runs

    def spawn(
        self, claim: Claim, command: Command, environment: dict[str, str], file_mode: int, cgroups: Cgroups = NO_CGROUPS
    ) -> int:
        """Start the command job's process (with `environment` over the manager's; in the run's
        cgroups, given their `cgroup.procs`: only where `enters_cgroup`); return its pid.
        RunGone if the run's folder is gone (a sweeper took the claim back); OSError if the
        host cannot spawn."""
        try:
            run = run_folder.open_run(claim.place, claim.run)
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
            pid = self.start(command.argv, environment, (stdin, stdout, stderr), cwd, cgroups)
            try:
                run_folder.write_pid(run, file_mode, pid)
            except OSError:
                pass  # only `forkvisor status` reads it; the job runs anyway
            return pid
        finally:
            for fd in [*opened, run]:
                os.close(fd)

    def start(
        self,
        program: tuple[str, ...],
        env: dict[str, str],
        stdio: tuple[int, int, int],
        cwd: str | None,
        cgroups: Cgroups = NO_CGROUPS,
    ) -> int:
        """Start `program` with `env` over the manager's environment, `stdio` as its 0, 1 and
        2, in `cwd` (None: where the manager is); return its pid."""
        raise NotImplementedError


class Vforked(Spawner):
    """Through `supervisor/_vfork.c` (`forking.vfork_exec`)."""

    enters_cgroup = True

    @classmethod
    def probe(cls) -> Vforked | None:
        """The module, if it was built and starts `true`; None (and why, in the log) if not."""
        if not forking.CAN_VFORK:
            log.info("command jobs are not vforked: forkvisor was installed without its C module")
            return None
        spawner = cls()
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            status = forking.wait_for(spawner.start(("true",), {}, (null, null, null), None), 10)
        except OSError as exc:
            log.info("command jobs are not vforked: %s", exc)
            return None
        finally:
            os.close(null)
        if status is None or status.code != 0:
            log.info("command jobs are not vforked: `true` %s", "vanished" if status is None else status.describe())
            return None
        return spawner

    def start(
        self,
        program: tuple[str, ...],
        env: dict[str, str],
        stdio: tuple[int, int, int],
        cwd: str | None,
        cgroups: Cgroups = NO_CGROUPS,
    ) -> int:
        return forking.vfork_exec(program, env, stdio, cwd, cgroups)


@dataclass(frozen=True)
class Chained(Spawner):
    """Through `setpriv` and `sh`, found once."""

    setpriv: str
    sh: str

    @classmethod
    def probe(cls) -> Chained | None:
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

    def start(
        self,
        program: tuple[str, ...],
        env: dict[str, str],
        stdio: tuple[int, int, int],
        cwd: str | None,
        cgroups: Cgroups = NO_CGROUPS,
    ) -> int:
        return forking.spawn(self.setpriv, self.argv(os.getpid(), cwd, program), {**os.environ, **env}, stdio)


@functools.cache
def _found() -> Spawner | None:
    return Vforked.probe() or Chained.probe()


def _above_stdio(fd: int) -> int:
    """`fd`, moved above 2 if it is one of them (a manager started with stdout closed): the
    spawn's dup2s onto 0, 1 and 2 must not overwrite a descriptor still to be copied."""
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved
