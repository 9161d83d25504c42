"""Pausing a queue: `QUEUE/paused` says that no manager, on any host, may start its
jobs (all of them, or those of some functions) until it is resumed. Running jobs
finish; nothing moves. Like `queue.json`, the file is the owner's: in a shared
queue only the owner may pause (members cannot write the queue folder).

    {"all": true}                       every job waits
    {"functions": ["report", "mail"]}   the jobs of these functions wait

A file that cannot be read as either pauses everything (a stuck queue that
`forkvisor status` names is better than jobs that run when told not to), and
`forkvisor resume` replaces it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from jobs import document, files
from jobs.errors import InvalidJob
from jobs.handles import Dir

PAUSE_FILE = "paused"
MAX_PAUSE_BYTES = 1 << 16


@dataclass(frozen=True)
class Paused:
    """What is paused: everything, or the jobs of some functions."""

    all: bool = False
    functions: frozenset[str] = frozenset()
    problem: str = ""  # why the file could not be read (then everything is paused)

    def __bool__(self) -> bool:
        return self.all or bool(self.functions)

    def covers(self, function: str) -> bool:
        return self.all or function in self.functions

    def describe(self) -> str:
        if self.problem:
            return f"everything ({self.problem})"
        return "everything" if self.all else ", ".join(sorted(self.functions))


NOT_PAUSED = Paused()


def read(root: Dir) -> Paused:
    """What the queue's `paused` file says (NOT_PAUSED without one)."""
    try:
        found = document.read(PAUSE_FILE, MAX_PAUSE_BYTES, PAUSE_FILE, root.fd)
    except FileNotFoundError:
        return NOT_PAUSED
    except InvalidJob as exc:
        return Paused(all=True, problem=str(exc))
    if isinstance(found, dict) and found.get("all") is True:
        return Paused(all=True)
    names = found.get("functions") if isinstance(found, dict) else None
    if isinstance(names, list) and names and all(isinstance(name, str) for name in names):
        return Paused(functions=frozenset(names))
    return Paused(all=True, problem=f'{PAUSE_FILE} is neither {{"all": true}} nor {{"functions": [...]}}')


def write(root: Dir, paused: Paused, mode: int) -> None:
    """Replace the `paused` file (renamed into place: managers see a new file), or remove
    it when nothing stays paused."""
    if not paused:
        files.unlink_if_there(PAUSE_FILE, root.fd)
        return
    content = {"all": True} if paused.all else {"functions": sorted(paused.functions)}
    files.replace_file(PAUSE_FILE, json.dumps(content).encode() + b"\n", durable=True, mode=mode, dir_fd=root.fd)


def paused_more(current: Paused, functions: Iterable[str] | None) -> Paused:
    """`current` and also `functions` (None: everything)."""
    if functions is None or current.all:
        return Paused(all=True)
    return Paused(functions=current.functions | frozenset(functions))


def paused_less(current: Paused, functions: Iterable[str] | None) -> Paused:
    """`current` without `functions` (None: nothing stays paused)."""
    if functions is None:
        return NOT_PAUSED
    if current.all:
        raise InvalidJob("everything is paused: resume the whole queue (no --function), then pause what should wait")
    return Paused(functions=current.functions - frozenset(functions))
