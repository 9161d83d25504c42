"""The states a power cut can leave, from a recording's operations, under two models.

A crash point is a moment between two system calls. At a crash point, an operation is
*durable* if a later barrier on its unit (an fsync of its directory, or of its file)
came before the point; the others may or may not have reached the disk.

- **weak** (POSIX promises no more): any unsynced operation may be lost, independently
  of the others, but for what depends on it (a rename stays whole, and a rename or a
  removal of an entry goes with the operation that made it: `model`). States: the exact prefix; only what
  was synced; the prefix without each one of the last unsynced operations; random
  subsets of the unsynced ones.
- **ordered** (ext4 data=ordered, XFS): directory operations reach the disk in order and
  all of them up to the point do (a journal commits them in order); unsynced data may be
  lost, cut short or zeroed. States: the prefix with each unsynced write lost, cut or
  zeroed, and with all of them lost.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from tests.crashstate.model import Op, Tree

WEAK, ORDERED = "weak", "ordered"


@dataclass(frozen=True)
class CrashState:
    model: str
    point: int  # how many operations the workload had made (a call boundary)
    how: str  # which of the point's states
    tree: Tree

    def marks(self, ops: Sequence[Op]) -> list[str]:
        """What the workload had acknowledged by this point (its marks, in order)."""
        return [op.text for op in ops[: self.point] if op.kind == "mark"]


def points(ops: Sequence[Op]) -> list[int]:
    """Every call boundary: after the last operation of each call (and before the first)."""
    found = [0]
    for index in range(1, len(ops) + 1):
        if index == len(ops) or ops[index].call != ops[index - 1].call:
            found.append(index)
    return found


def durable(ops: Sequence[Op], point: int) -> set[int]:
    """The operations before `point` that a barrier before `point` made durable."""
    synced: set[tuple[str, int]] = set()
    everything = False
    found: set[int] = set()
    for index in range(point - 1, -1, -1):
        op = ops[index]
        if op.kind == "sync":
            if op.unit is None:
                everything = True
            else:
                synced.add(op.unit)
        elif op.kind == "rename" and (everything or ("dir", op.dir) in synced or ("dir", op.dir2) in synced):
            found.add(index)  # (whole: durable once either of its folders is synced)
        elif op.kind != "mark" and (everything or op.unit in synced):
            found.add(index)
    for index in sorted(found, reverse=True):  # what a durable operation acted on is on disk too
        needed = ops[index].needs
        while needed >= 0 and needed not in found:
            found.add(needed)
            needed = ops[needed].needs
    return found


def states(
    ops: Sequence[Op], initial: Tree, rng: random.Random, every: int = 1, window: int = 12, subsets: int = 2
) -> Iterator[CrashState]:
    """The crash states of every `every`-th crash point, under both models."""
    for point in points(ops)[::every]:
        changes = [index for index in range(point) if ops[index].kind not in ("sync", "mark")]
        kept = durable(ops, point)
        unsynced = [index for index in changes if index not in kept]
        yield CrashState(WEAK, point, "prefix", _tree(ops, initial, changes))
        if unsynced:
            yield CrashState(WEAK, point, "synced only", _tree(ops, initial, sorted(kept)))
        for lost in unsynced[-window:]:
            yield CrashState(WEAK, point, f"without op {lost}", _tree(ops, initial, [i for i in changes if i != lost]))
        for _ in range(subsets if len(unsynced) > 1 else 0):
            chosen = {index for index in unsynced if rng.random() < 0.5}
            yield CrashState(WEAK, point, "a random subset", _tree(ops, initial, sorted(kept | chosen)))
        data = [index for index in unsynced if ops[index].kind in ("write", "truncate")]
        if data:
            yield CrashState(
                ORDERED, point, "unsynced data lost", _tree(ops, initial, [i for i in changes if i not in data])
            )
        for index in data[-window:]:
            if ops[index].kind == "write" and ops[index].data:
                for how in ("cut", "zeroed"):
                    yield CrashState(ORDERED, point, f"op {index} {how}", _tree(ops, initial, changes, {index: how}))


def _tree(ops: Sequence[Op], initial: Tree, indices: Sequence[int], damaged: dict[int, str] | None = None) -> Tree:
    """The folder with the operations at `indices` (in order), but those that act on an
    entry whose making is not among them (a disk keeps no rename of an entry it lost)."""
    tree = copy.deepcopy(initial)
    applied: set[int] = set()
    for index in indices:
        op = ops[index]
        if op.needs >= 0 and op.needs not in applied:
            continue
        applied.add(index)
        how = (damaged or {}).get(index)
        if how == "cut":
            op = Op("write", op.call, op.unit, ino=op.ino, offset=op.offset, data=op.data[: len(op.data) // 2])
        elif how == "zeroed":
            op = Op("write", op.call, op.unit, ino=op.ino, offset=op.offset, data=bytes(len(op.data)))
        tree.apply(op)
    return tree
