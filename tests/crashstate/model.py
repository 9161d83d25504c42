"""A folder as a power cut sees it: inodes, directory entries and data, the operations a
workload made on them (from its trace), and which of them a barrier made durable.

Each system call becomes an operation on the *unit* a barrier covers: an entry added to
or removed from a directory is the directory's (made durable by an fsync of that
directory), data written or cut is the file's (by an fsync of the file). A rename is one
operation on two directories: it reaches the disk whole or not at all (as every file
system we know keeps it, and as the crash-testing literature's weak model does), and is
durable once either directory is fsynced after it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tests.crashstate.trace import Call

O_CREAT, O_TRUNC, O_APPEND, O_DIRECTORY = os.O_CREAT, os.O_TRUNC, os.O_APPEND, os.O_DIRECTORY
AT_REMOVEDIR = 0x200
FALLOC_FL_PUNCH_HOLE = 0x02
_FLAGS = {name: getattr(os, name) for name in dir(os) if name.startswith("O_")}


@dataclass
class Inode:
    kind: str  # "d", "f" or "p" (a FIFO: a manager's doorbell, whose bytes never reach the disk)
    mode: int
    uid: int = 0  # who owns it: the workloads' own processes run as root
    gid: int = 0
    disk_ino: int = 0  # its number on the recording's disk (a file there before the trace)
    entries: dict[str, int] = field(default_factory=dict)  # a directory's
    data: bytearray = field(default_factory=bytearray)  # a file's


@dataclass
class Tree:
    """The folder's inodes; inode 1 is the folder itself."""

    inodes: dict[int, Inode] = field(default_factory=lambda: {1: Inode("d", 0o755)})

    @classmethod
    def read(cls, root: Path) -> Tree:
        """The folder as it is on disk (hard links kept as one inode)."""
        tree, numbers = cls(), {os.lstat(root).st_ino: 1}
        status = os.lstat(root)
        tree.inodes[1] = Inode("d", stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid)
        for folder, names, files in os.walk(root):
            parent = tree.inodes[numbers[os.lstat(folder).st_ino]]
            for name in [*names, *files]:
                path = os.path.join(folder, name)
                status = os.lstat(path)
                if status.st_ino not in numbers:
                    numbers[status.st_ino] = number = max(tree.inodes) + 1
                    kind = "d" if stat.S_ISDIR(status.st_mode) else "p" if stat.S_ISFIFO(status.st_mode) else "f"
                    found = Inode(kind, stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid, status.st_ino)
                    if kind == "f":
                        found.data = bytearray(Path(path).read_bytes()) if stat.S_ISREG(status.st_mode) else bytearray()
                    tree.inodes[number] = found
                parent.entries[name] = numbers[status.st_ino]
        return tree

    def lookup(self, parts: Iterable[str]) -> int | None:
        number = 1
        for part in parts:
            entries = self.inodes[number].entries
            if part not in entries:
                return None
            number = entries[part]
        return number

    def apply(self, op: Op) -> None:
        if op.kind == "add":
            parent = self.inodes.setdefault(op.dir, Inode("d", 0o755))
            if op.ino not in self.inodes:
                self.inodes[op.ino] = _new_inode(op.new_kind or "f", op.mode, parent)
            parent.entries[op.name] = op.ino
        elif op.kind == "remove":
            self.inodes.setdefault(op.dir, Inode("d", 0o755)).entries.pop(op.name, None)
        elif op.kind == "rename":
            number = self.inodes.setdefault(op.dir, Inode("d", 0o755)).entries.pop(op.name, op.ino)
            self.inodes.setdefault(op.dir2, Inode("d", 0o755)).entries[op.name2] = number
        elif op.kind == "write":
            data = self.inodes.setdefault(op.ino, Inode("f", 0o600)).data
            if len(data) < op.offset:
                data.extend(bytes(op.offset - len(data)))
            data[op.offset : op.offset + len(op.data)] = op.data
        elif op.kind == "truncate":
            data = self.inodes.setdefault(op.ino, Inode("f", 0o600)).data
            del data[op.size :]
            data.extend(bytes(max(0, op.size - len(data))))

    def materialize(self, root: Path) -> dict[int, int]:
        """Write the folder as it would be found: what inode 1 reaches (a directory reached
        twice, which a lost removal can leave, is written at each place). Return the copy's
        inode number of each file the recording's disk had before the trace, by that disk's
        number (a real disk keeps a file's number; a copy cannot)."""
        root.mkdir(parents=True)
        written: dict[int, Path] = {}
        stack: list[tuple[int, Path, frozenset[int]]] = [(1, root, frozenset({1}))]
        while stack:
            number, path, above = stack.pop()
            for name, child in sorted(self.inodes[number].entries.items()):
                target, inode = path / name, self.inodes.get(child)
                if inode is None:
                    continue
                if inode.kind == "d":
                    if child in above:
                        continue  # a loop no real file system has: not followed
                    target.mkdir()
                    stack.append((child, target, above | {child}))
                elif inode.kind == "p":
                    os.mkfifo(target)
                    _own(target, inode, 0o600)
                elif child in written:
                    os.link(written[child], target)
                else:
                    target.write_bytes(bytes(inode.data))
                    written[child] = target
            _own(path, self.inodes[number], 0o700)
        renumbered = {}
        for number, path in written.items():
            _own(path, self.inodes[number], 0o600)
            if self.inodes[number].disk_ino:
                renumbered[self.inodes[number].disk_ino] = os.lstat(path).st_ino
        return renumbered

    def signature(self) -> tuple[object, ...]:
        """What a materialized state would hold (equal for states that would be equal on disk)."""
        found: list[tuple[str, str, bytes]] = []

        def walk(number: int, prefix: str, above: frozenset[int]) -> None:
            for name, child in sorted(self.inodes[number].entries.items()):
                inode = self.inodes.get(child)
                if inode is None or child in above:
                    continue
                found.append((prefix + name, inode.kind, bytes(inode.data)))
                if inode.kind == "d":
                    walk(child, f"{prefix}{name}/", above | {child})

        walk(1, "", frozenset({1}))
        return tuple(found)


def _new_inode(kind: str, mode: int, parent: Inode) -> Inode:
    """An inode made in `parent`: a setgid folder gives its group (and, to a folder, its setgid)."""
    if not parent.mode & stat.S_ISGID:
        return Inode(kind, mode)
    return Inode(kind, mode | (stat.S_ISGID if kind == "d" else 0), gid=parent.gid)


def _own(path: Path, inode: Inode, rights: int) -> None:
    """Give `path` its inode's owner and mode (the owner first: a change of owner clears setgid)."""
    os.lchown(path, inode.uid, inode.gid)
    os.chmod(path, inode.mode | rights)


@dataclass(frozen=True)
class Op:
    """One operation on the folder, or a mark (`kind` "mark": what the workload acknowledged)."""

    kind: str  # add, remove, rename, write, truncate, sync, mark
    call: int  # the index of the system call it came from
    unit: tuple[str, int] | None = None  # ("dir", inode) or ("data", inode): what a barrier on it covers
    dir: int = 0
    name: str = ""
    ino: int = 0
    new_kind: str = ""
    mode: int = 0o600
    offset: int = 0
    data: bytes = b""
    size: int = 0
    text: str = ""
    dir2: int = 0  # a rename's target
    name2: str = ""
    needs: int = -1  # the operation that made the entry a rename or removal acts on (-1: none, or before)


@dataclass
class _Open:
    ino: int
    append: bool
    offset: int = 0


class Recording:
    """Turns a trace's calls into the operations on `root` (and marks written to `marks`)."""

    def __init__(self, root: Path, marks: Path, initial: Tree) -> None:
        self.root, self.marks = str(root), str(marks)
        self.tree = copy.deepcopy(initial)  # the folder as the calls so far left it
        self.ops: list[Op] = []
        self.files: dict[int, dict[int, _Open | str]] = {}  # pid -> fd -> what it is (str: the marks file)
        self.next_ino = max(initial.inodes) + 1
        self.calls = 0
        self.made: dict[tuple[int, str], int] = {}  # (directory, name) -> the operation that put the entry there

    def add(self, calls: Iterable[Call]) -> list[Op]:
        for call in calls:
            handler = getattr(self, f"_{call.name}", None)
            if handler is not None and call.result >= 0:
                handler(call)
            self.calls += 1
        return self.ops

    # -- resolving -----------------------------------------------------------------------------

    def _parts(self, path: str | None) -> list[str] | None:
        if path is None or not (path == self.root or path.startswith(self.root + "/")):
            return None
        return [part for part in path[len(self.root) :].split("/") if part]

    def _at(self, call: Call, fd_index: int, name_index: int) -> tuple[int, str] | None:
        """(directory inode, name) of a `*at` call's path, if it is in the folder."""
        _, base = call.fd(fd_index)
        name = os.fsdecode(call.text(name_index))
        full = name if name.startswith("/") else f"{base}/{name}"
        parts = self._parts(os.path.normpath(full))
        if not parts:
            return None
        parent = self.tree.lookup(parts[:-1])
        return None if parent is None else (parent, parts[-1])

    def _emit(self, op: Op) -> None:
        """Record `op`, with the operation it depends on: a rename or a removal acts on an
        entry an earlier operation made, and no disk keeps the one without the other."""
        if op.kind in ("rename", "remove"):
            op = dataclasses.replace(op, needs=self.made.pop((op.dir, op.name), -1))
        if op.kind in ("add", "rename"):
            target = (op.dir2, op.name2) if op.kind == "rename" else (op.dir, op.name)
            self.made[target] = len(self.ops)
        self.ops.append(op)
        self.tree.apply(op)

    def _table(self, pid: int) -> dict[int, _Open | str]:
        return self.files.setdefault(pid, {})

    # -- the calls -----------------------------------------------------------------------------

    def _openat(self, call: Call, fd_index: int = 0, name_index: int = 1, flags_index: int = 2) -> None:
        flags = _flags(call.args[flags_index])
        if call.result_path == self.marks:
            self._table(call.pid)[call.result] = "marks"
            return
        if self._parts(call.result_path) == []:  # the folder itself
            self._table(call.pid)[call.result] = _Open(1, False)
            return
        where = self._at(call, fd_index, name_index) if fd_index >= 0 else None
        if where is None:
            self._table(call.pid).pop(call.result, None)
            return
        parent, name = where
        number = self.tree.inodes[parent].entries.get(name)
        if number is None:
            if not flags & O_CREAT:
                return
            number, self.next_ino = self.next_ino, self.next_ino + 1
            mode = int(call.args[flags_index + 1], 8) if len(call.args) > flags_index + 1 else 0o600
            self._emit(Op("add", self.calls, ("dir", parent), parent, name, number, "f", mode & 0o777))
        elif self.tree.inodes[number].kind == "p":
            self._table(call.pid).pop(call.result, None)  # what goes through a FIFO is not the folder's
            return
        elif flags & O_TRUNC and self.tree.inodes[number].kind == "f":
            self._emit(Op("truncate", self.calls, ("data", number), ino=number, size=0))
        self._table(call.pid)[call.result] = _Open(number, bool(flags & O_APPEND))

    def _open(self, call: Call) -> None:
        self._openat_path(call, 0, 1)

    def _creat(self, call: Call) -> None:
        self._openat_path(call, 0, None)

    def _openat_path(self, call: Call, name_index: int, flags_index: int | None) -> None:
        args = ("AT_FDCWD", call.args[name_index], call.args[flags_index] if flags_index is not None else "O_CREAT")
        self._openat(Call(call.pid, "openat", (*args, *call.args[2:]), call.result, call.result_path))

    def _write(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        data = call.text(1)[: call.result]
        if opened == "marks":
            for line in data.decode(errors="replace").splitlines():
                self.ops.append(Op("mark", self.calls, text=line))
        elif isinstance(opened, _Open) and opened.ino in self.tree.inodes:
            offset = len(self.tree.inodes[opened.ino].data) if opened.append else opened.offset
            self._emit(Op("write", self.calls, ("data", opened.ino), ino=opened.ino, offset=offset, data=data))
            opened.offset = offset + len(data)

    def _pwrite64(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        if isinstance(opened, _Open):
            data = call.text(1)[: call.result]
            self._emit(
                Op("write", self.calls, ("data", opened.ino), ino=opened.ino, offset=int(call.args[3]), data=data)
            )

    def _ftruncate(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        if isinstance(opened, _Open):
            self._emit(Op("truncate", self.calls, ("data", opened.ino), ino=opened.ino, size=int(call.args[1])))

    def _fallocate(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        if isinstance(opened, _Open) and "PUNCH_HOLE" in call.args[1]:
            offset, length = int(call.args[2]), int(call.args[3])
            zeros = bytes(max(0, min(length, len(self.tree.inodes[opened.ino].data) - offset)))
            self._emit(Op("write", self.calls, ("data", opened.ino), ino=opened.ino, offset=offset, data=zeros))

    def _fsync(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        if isinstance(opened, _Open) and opened.ino in self.tree.inodes:
            kind = "dir" if self.tree.inodes[opened.ino].kind == "d" else "data"
            self.ops.append(Op("sync", self.calls, (kind, opened.ino)))

    _fdatasync = _fsync

    def _sync(self, call: Call) -> None:
        self.ops.append(Op("sync", self.calls, None))  # everything

    _syncfs = _sync

    def _mkdirat(self, call: Call, fd_index: int = 0, name_index: int = 1) -> None:
        where = self._at(call, fd_index, name_index)
        if where is not None:
            number, self.next_ino = self.next_ino, self.next_ino + 1
            mode = int(call.args[name_index + 1], 8) & 0o7777
            self._emit(Op("add", self.calls, ("dir", where[0]), where[0], where[1], number, "d", mode))

    def _mknodat(self, call: Call) -> None:
        """A FIFO (a manager's doorbell, `supervisor.bell`): an entry whose bytes never reach the disk."""
        where = self._at(call, 0, 1)
        if where is not None:
            number, self.next_ino = self.next_ino, self.next_ino + 1
            mode = int(call.args[2].rsplit("|", 1)[-1], 8) & 0o7777
            self._emit(Op("add", self.calls, ("dir", where[0]), where[0], where[1], number, "p", mode))

    def _mkdir(self, call: Call) -> None:
        self._mkdirat(Call(call.pid, "mkdirat", ("AT_FDCWD", *call.args), call.result, None))

    def _unlinkat(self, call: Call, fd_index: int = 0, name_index: int = 1) -> None:
        where = self._at(call, fd_index, name_index)
        if where is not None and where[1] in self.tree.inodes[where[0]].entries:
            self._emit(Op("remove", self.calls, ("dir", where[0]), where[0], where[1]))

    def _unlink(self, call: Call) -> None:
        self._unlinkat(Call(call.pid, "unlinkat", ("AT_FDCWD", *call.args), call.result, None))

    _rmdir = _unlink

    def _renameat2(self, call: Call) -> None:
        source, target = self._at(call, 0, 1), self._at(call, 2, 3)
        if source is None or target is None:
            return
        number = self.tree.inodes[source[0]].entries.get(source[1])
        if number is None:
            return
        op = Op("rename", self.calls, ("dir", target[0]), source[0], source[1], number, dir2=target[0], name2=target[1])
        self._emit(op)

    _renameat = _renameat2

    def _rename(self, call: Call) -> None:
        args = ("AT_FDCWD", call.args[0], "AT_FDCWD", call.args[1])
        self._renameat2(Call(call.pid, "renameat2", args, call.result, None))

    def _linkat(self, call: Call) -> None:
        source, target = self._at(call, 0, 1), self._at(call, 2, 3)
        if source is None or target is None:
            return
        number = self.tree.inodes[source[0]].entries.get(source[1])
        if number is not None:
            self._emit(Op("add", self.calls, ("dir", target[0]), target[0], target[1], number))

    def _link(self, call: Call) -> None:
        args = ("AT_FDCWD", call.args[0], "AT_FDCWD", call.args[1])
        self._linkat(Call(call.pid, "linkat", args, call.result, None))

    def _close(self, call: Call) -> None:
        self._table(call.pid).pop(call.fd(0)[0], None)

    def _dup(self, call: Call) -> None:
        self._copy_fd(call.pid, call.fd(0)[0], call.result)

    _dup2 = _dup3 = _dup

    def _fcntl(self, call: Call) -> None:
        if "F_DUPFD" in call.args[1]:
            self._copy_fd(call.pid, call.fd(0)[0], call.result)

    def _copy_fd(self, pid: int, old: int, new: int) -> None:
        table = self._table(pid)
        if old in table:
            table[new] = table[old]
        else:
            table.pop(new, None)

    def _lseek(self, call: Call) -> None:
        opened = self._table(call.pid).get(call.fd(0)[0])
        if isinstance(opened, _Open):
            opened.offset = call.result

    def _clone(self, call: Call) -> None:
        """A new process: a copy of its parent's descriptors (shared offsets are not modelled:
        the workloads' processes write their own files, or append)."""
        self.files[call.result] = {
            fd: (copy.copy(what) if isinstance(what, _Open) else what) for fd, what in self._table(call.pid).items()
        }

    _clone3 = _fork = _vfork = _clone


def _flags(token: str) -> int:
    value = 0
    for name in token.split("|"):
        value |= _FLAGS.get(name.strip(), 0)
    return value
