"""Where mutants run: detached git worktrees of HEAD under /tmp, one per worker, and a
pytest run in one of them that is timed, bounded, and leaves no process behind.

The tests find the repository from their own `__file__`, and the worktree comes first on
`PYTHONPATH` (the venv's editable install points at the main checkout), so a test and
every process it starts import the worktree's mutated code.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PYTHON = sys.executable  # the project's venv python, which runs this tool
PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
TAG = "FV_MUTATION_WORKER"  # in the environment of every process a run starts: whose it is
INTERRUPT_GRACE = 5.0  # after a timeout, seconds pytest gets to run its teardowns

_running_pytests: set[int] = set()  # pids of the pytest runs under way: not leftovers


@dataclass(frozen=True)
class TestRun:
    status: str  # "passed", "failed", "timeout" or "error" (pytest could not run the tests)
    seconds: float
    output: str  # the tail of pytest's output


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return done.stdout


def source_at(repo: Path, commit: str, module: str) -> str:
    """The module as `commit` has it: what the worktrees hold, whatever the checkout's edits."""
    return git(repo, "show", f"{commit}:{module}")


class Worktree:
    """A detached worktree of `commit`, its C extension built, reset between mutants.
    `alone`: no other worktree runs tests meanwhile, so every process left behind is its own."""

    def __init__(self, repo: Path, path: Path, index: int, alone: bool = False) -> None:
        self.repo, self.path, self.index, self.alone = repo, path, index, alone

    def prepare(self, commit: str) -> None:
        """Reuse the worktree at `path` if it is one of `repo`'s (moved to `commit`), else add it."""
        registered = git(self.repo, "worktree", "list", "--porcelain").splitlines()
        if f"worktree {self.path}" in registered:
            git(self.path, "checkout", "--quiet", "--force", "--detach", commit)
        elif self.path.exists():
            raise RuntimeError(f"{self.path} exists and is not a worktree of {self.repo}: remove it or pick another")
        else:
            git(self.repo, "worktree", "add", "--quiet", "--detach", str(self.path), commit)
        self._build()
        self._check_imports()

    def _build(self) -> None:
        """The optional C module, as an install builds it (without it command jobs take
        another path, and the tests of that path are not the ones the checkout runs)."""
        if not (self.path / "setup.py").exists() or any(self.path.glob("supervisor/_vfork*.so")):
            return
        built = subprocess.run(
            [PYTHON, "setup.py", "-q", "build_ext", "--inplace"], cwd=self.path, capture_output=True, text=True
        )
        if built.returncode != 0:
            print(f"warning: building the C extension in {self.path} failed:\n{built.stderr[-2000:]}", flush=True)

    def _check_imports(self) -> None:
        """Refuse to measure anything if the tests would import the checkout's code, not ours."""
        program = "import jobs, supervisor; print(jobs.__file__); print(supervisor.__file__)"
        done = subprocess.run(
            [PYTHON, "-c", program], cwd=self.path, env=self.environment(), capture_output=True, text=True, check=True
        )
        for found in done.stdout.split():
            if not Path(found).resolve().is_relative_to(self.path.resolve()):
                raise RuntimeError(f"the worktree {self.path} imports {found}, not its own code")

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.path), env.get("PYTHONPATH")]))
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutant restored within the second must not leave a stale .pyc
        env[TAG] = str(self.index)
        return env

    def write(self, module: str, text: str) -> None:
        (self.path / module).write_text(text, encoding="utf-8")

    def reset(self) -> None:
        git(self.path, "checkout", "--quiet", "--", ".")

    def remove(self) -> None:
        command = ["git", "-C", str(self.repo), "worktree", "remove", "--force", str(self.path)]
        subprocess.run(command, capture_output=True, check=False)

    def run_tests(self, tests: list[str], timeout: float) -> TestRun:
        """The tests, stopping at the first failure, in this worktree, within `timeout` seconds."""
        command = [PYTHON, "-m", "pytest", "-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-m", "not slow"]
        with tempfile.TemporaryFile("w+") as log:  # not a pipe: a leftover process may hold it open
            started = time.monotonic()
            process = subprocess.Popen(
                [*command, *tests],
                cwd=self.path,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a timeout ends all of it, and ^C here does not reach it
            )
            _running_pytests.add(process.pid)
            try:
                code: int | None = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
                _stop(process)
            finally:
                _running_pytests.discard(process.pid)
            seconds = time.monotonic() - started
            end_leftovers(None if self.alone else str(self.index))  # alone: those that dropped the tag too
            log.seek(0)
            output = log.read()[-3000:]
        return TestRun(_status(code), seconds, output)


def _status(code: int | None) -> str:
    """pytest's exit code as a verdict: 1 is a failed test, 2 an interrupted run (a mutant
    that breaks an import fails collection that way); 3-5 mean the tests did not run."""
    if code is None:
        return "timeout"
    return {0: "passed", 1: "failed", 2: "failed"}.get(code, "error")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGINT first, so pytest runs its fixtures' teardowns (they stop the managers the
    tests started), then SIGKILL to whatever is left of its process group."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=INTERRUPT_GRACE)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def become_subreaper() -> None:
    """Processes the tests leave behind (a daemon in its own session, say) come to us when
    their parents die, rather than to init, so `end_leftovers` can find and end them."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("warning: cannot become a subreaper: processes a test leaves may outlive it", flush=True)


def end_leftovers(tag: str | None) -> None:
    """Kill and reap the processes adopted from a finished run (`tag`: of that worker only;
    None: all of them), until none is left: each one's children come to us as it dies."""
    while True:
        found = [pid for pid in _adopted() if tag is None or _tag_of(pid) == tag]
        if not found:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _adopted() -> list[int]:
    """Our children that no worker started (a worker's pytest carries the tag too, but it is
    reaped by its Popen before `end_leftovers` runs, and the pids of live ones are skipped)."""
    me, children = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, ...
        if int(fields[1]) == me and int(entry) not in _running_pytests:
            children.append(int(entry))
    return children


def _tag_of(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(TAG.encode() + b"="):
            return item.split(b"=", 1)[1].decode()
    return None


def stop_all() -> None:
    """On an interrupt: end every pytest run under way (each is its own process group)."""
    for pid in list(_running_pytests):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
