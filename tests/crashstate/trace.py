"""Record what a workload does to the file system, system call by system call (strace),
and read it back as the operations on one folder (`ops`): entries added to and removed
from directories, data written and cut, barriers (fsync), and the workload's own marks
(what it acknowledged, written to a file outside the folder).

strace prints every string in hex (`-xx`) and every descriptor with its path (`-y`), so a
line splits at ", " outside brackets and every name decodes the same way. A call another
process interrupted is printed in two halves (`<unfinished ...>`, `<... resumed>`), joined
here by pid.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

CALLS = (
    "openat,open,creat,write,pwrite64,fsync,fdatasync,sync,syncfs,rename,renameat,renameat2,mkdir,mkdirat,mknodat,"
    "unlink,unlinkat,rmdir,link,linkat,ftruncate,fallocate,close,dup,dup2,dup3,fcntl,lseek,clone,clone3,fork,vfork"
)
_LINE = re.compile(r"^(\d+) +(\w+)\((.*)\) += (-?\d+|\?)(<[^>]*>)?")
_UNFINISHED = re.compile(r"^(\d+) +(.*) <unfinished \.\.\.>$")
_RESUMED = re.compile(r"^(\d+) +<\.\.\. (\w+) resumed>(.*)$")


@dataclass(frozen=True)
class Call:
    """One system call as strace printed it: its arguments' tokens and its result."""

    pid: int
    name: str
    args: tuple[str, ...]
    result: int
    result_path: str | None  # the path of a returned descriptor

    def text(self, index: int) -> bytes:
        """Argument `index`, a hex-escaped string, as bytes."""
        return decode(self.args[index])

    def fd(self, index: int) -> tuple[int, str | None]:
        """Argument `index`, a descriptor: its number (AT_FDCWD: -100) and its path."""
        return descriptor(self.args[index])


def record(argv: Sequence[str], trace: Path, env: Mapping[str, str] | None = None, timeout: float = 300) -> int:
    """Run `argv` under strace, its calls written to `trace` and its output beside it
    (`trace` + ".log"); its exit status."""
    command = ["strace", "-f", "-qq", "-y", "-xx", "-s", "1048576", "-o", str(trace), "-e", f"trace={CALLS}", *argv]
    with open(f"{trace}.log", "wb") as output:
        environment = dict(env) if env is not None else None
        done = subprocess.run(command, env=environment, stdout=output, stderr=output, timeout=timeout, check=False)
    return done.returncode


def calls(trace: Path) -> Iterator[Call]:
    """The calls of a trace, in the order they ended (halves joined)."""
    pending: dict[int, str] = {}
    with open(trace, encoding="ascii", errors="replace") as lines:
        for raw in lines:
            line = raw.rstrip("\n")
            if (unfinished := _UNFINISHED.match(line)) is not None:
                pending[int(unfinished[1])] = unfinished[2]
                continue
            if (resumed := _RESUMED.match(line)) is not None:
                pid = int(resumed[1])
                line = f"{pid} {pending.pop(pid, resumed[2] + '(')}{resumed[3]}"
            if (found := _LINE.match(line)) is None or found[4] == "?":
                continue  # a signal, an exit, a call that never returned
            path = decode_path(found[5][1:-1]) if found[5] else None
            yield Call(int(found[1]), found[2], tuple(split(found[3])), int(found[4]), path)


def split(arguments: str) -> Iterator[str]:
    """The tokens of an argument list, split at ", " outside brackets and quotes."""
    depth, start, quoted = 0, 0, False
    for index, char in enumerate(arguments):
        if char == '"':
            quoted = not quoted  # (-xx: no quote is ever escaped inside a string)
        elif quoted:
            continue
        elif char in "{[<(":
            depth += 1
        elif char in "}]>)":
            depth -= 1
        elif char == "," and depth == 0:
            yield arguments[start:index].strip()
            start = index + 1
    if arguments[start:].strip():
        yield arguments[start:].strip()


def decode(token: str) -> bytes:
    """A hex-escaped string token ("\\x2f\\x74..."), possibly cut short ("..."), as bytes."""
    body = token.strip()
    if body.endswith("..."):
        body = body[:-3]
    body = body.strip('"')
    return bytes(int(body[index + 2 : index + 4], 16) for index in range(0, len(body), 4))


def decode_path(text: str) -> str:
    return os.fsdecode(decode(text))


def descriptor(token: str) -> tuple[int, str | None]:
    """`5<\\x2f...>` or `AT_FDCWD<...>` as (number, path)."""
    head, _, rest = token.partition("<")
    number = -100 if head == "AT_FDCWD" else int(head)
    return number, (decode_path(rest[: rest.rindex(">")]) if rest else None)  # (a path may end "(deleted)")
