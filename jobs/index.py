"""The ready index: which `ready/` entry to try to claim next, without listing
the folder on every claim.

`ready/` names sort in claim order (priority, then enqueue time). The index
keeps the smallest names of the last scan in a heap and hands them out in
order: a sixteenth of what the previous scan saw, at least `limit` and at most
`MAX_KEPT`, so that a scan, whose cost grows with the folder, serves a number
of claims that grows with it too. It rescans when it runs dry, or when the last scan is older than
`STALE_FACTOR` times that scan's own duration, so scanning costs a bounded
share of the time whatever the folder's size. Names the caller learns of in
between (inotify tells the manager each new name) are added at once when they
cannot jump over names the index has not seen. Once a watcher feeds it (`note`,
or `watching` as the watch is set up), the index needs no scan to see new names,
only when it runs dry, so it rescans at most once a second: a safety net for
events the kernel dropped (and, on NFS, for other hosts' jobs, which make no
event here). Names another manager claimed meanwhile cost one failed rename
each, not a scan.

Names the claimer gave back (jobs it cannot run: `skip`) are never handed out
again, nor kept by a scan, as long as they stay in `ready/`: a head of jobs for
other managers costs one look each, not one per turn. They are remembered by
their hash (8 bytes of table each, not the string), and forgotten by the first
scan that no longer sees them. A heap that ran dry after a scan that saw every
name rescans only when that is cheap next to the last scan's own cost (again
`STALE_FACTOR`), so a folder full of skipped names is not listed on every claim.

The index is a hint: every name it gives may already be gone (another manager
claimed it), and the claim's rename is what decides.
"""

from __future__ import annotations

import heapq
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

STALE_FACTOR = 20
DEFAULT_LIMIT = 8192  # names kept from a scan, at least
KEPT_SHARE = 16  # of a larger folder, keep this share: a scan of N names then serves N/16 claims
MAX_KEPT = 65536  # and at most this many: about 8 MB of names, reached at a million queued
# The least age at which a scan is stale. Unwatched, other processes' new names are seen
# only by scanning, so the next one comes soon. Watched (a watcher reports every new
# name through `note`), a scan only makes up for events the kernel dropped.
UNWATCHED_MIN_AGE = 0.05
WATCHED_MIN_AGE = 1.0


Scan = Callable[[], AbstractContextManager[Iterator[os.DirEntry[str]]]]  # lists ready/, as os.scandir does
MAX_LOOKED = 32  # names a pop with a share looks at, at most


class Share:
    """Which names of `ready/` one of `managers` managers tries first: those whose name's
    CRC-32 (the same in every process, unlike `hash`) leaves `rank` modulo `managers`.
    Each looks at the next `2 * managers` names, so it nearly always finds one of its
    own, and takes the first name if none is: a share is a preference, never a limit
    (the rename decides, and a lone manager's share is everything: `None`). Only names of
    the head's priority are looked at, and a head passed over too often is taken: the
    order of priorities holds, and no job waits for a busy manager whose share it is."""

    __slots__ = ("looked", "managers", "rank")

    def __init__(self, managers: int, rank: int) -> None:
        self.managers, self.rank = managers, rank
        self.looked = min(2 * managers, MAX_LOOKED)

    def holds(self, name: str) -> bool:
        return zlib.crc32(name.encode()) % self.managers == self.rank


class Shares:
    """An owner's share of `ready/` among the owners serving it (`owners` lists them),
    worked out again after each scan of the folder (`of`)."""

    def __init__(self, owners: Callable[[], list[str]]) -> None:
        self._owners = owners
        self._share: Share | None = None
        self._scan = -1  # the scan it was worked out after

    def of(self, owner: str, scan: int) -> Share | None:
        """`owner`'s share as of the index's scan number `scan`; None if it is alone."""
        if scan != self._scan:
            self._scan, owners = scan, sorted(self._owners())
            alone = len(owners) < 2 or owner not in owners
            self._share = None if alone else Share(len(owners), owners.index(owner))
        return self._share


class ReadyIndex:
    """Candidates for the next claim from one `ready/` folder."""

    def __init__(self, scan: Scan, limit: int | None = None) -> None:
        limit = DEFAULT_LIMIT if limit is None else limit  # read at each call: a test may lower it
        self._scan = scan  # lists `ready/` (through the queue's handle of it)
        self._limit = limit
        self._keep = limit  # how many the next scan keeps, from what the last one saw
        self._heap: list[str] = []
        self._known: set[str] = set()
        self._complete = False  # the heap held every name at the last scan
        self._bound = ""  # when not complete: the largest name kept
        self._scanned_at = 0.0
        self._scan_cost = 0.0
        self._watched = False  # names have come from a watcher of the folder (inotify)
        self._skipped: set[int] = set()  # hashes of names the claimer gave back
        self._passed, self._passes = "", 0  # the head a share passed over, how many times in a row
        self.scans = 0

    def pop(self, rescan: bool = True, share: Share | None = None) -> str | None:
        """The next name to try, or None when `ready/` looks empty (or, with
        `rescan=False`, when the names in hand are used up). With a `share` (several
        managers serve the folder), the first of the next few names that is in this
        manager's share, else the next: managers that all looked at the same head try
        different names of it, instead of racing for its first (`Share`)."""
        if rescan and (self._is_stale() or (not self._heap and self._worth_rescanning())):
            self.rescan()
        if not self._heap:
            return None
        name = heapq.heappop(self._heap) if share is None else self._pop_from(share)
        self._known.discard(name)
        return name

    def _pop_from(self, share: Share) -> str:
        """The first name of `share` among the next few of the head's priority, else the
        head; and the head itself once this index has passed it over `share.looked` times
        (its manager may be busy for hours: no job waits on one manager's share)."""
        head = self._heap[0]
        if head == self._passed and self._passes >= share.looked:
            self._passed, self._passes = "", 0
            return heapq.heappop(self._heap)
        priority = head[: head.find(".") + 1]
        looked = [heapq.heappop(self._heap) for _ in range(min(share.looked, len(self._heap)))]
        chosen = next((name for name in looked if name.startswith(priority) and share.holds(name)), head)
        for name in looked:
            if name is not chosen:
                heapq.heappush(self._heap, name)
        if chosen == head:
            self._passed, self._passes = "", 0
        else:
            self._passes = self._passes + 1 if head == self._passed else 1
            self._passed = head
        return chosen

    def add(self, name: str) -> None:
        """Learn of a new entry (e.g. from inotify) without rescanning."""
        if name in self._known or (not self._complete and name > self._bound) or hash(name) in self._skipped:
            return  # unseen names may sort before it: the next scan finds it
        heapq.heappush(self._heap, name)
        self._known.add(name)

    def note(self, name: str) -> None:
        """Learn of a new entry from a watcher of the folder, which reports every new
        name: from now on the index rescans only as a safety net, not to find names."""
        self._watched = True
        self.add(name)

    def watching(self) -> None:
        """A watcher of the folder reports every new name from now on (inotify's watch was just
        set up): the index rescans once, at its next pop, for what came before the watch, and
        then only as a safety net, as if it had been told of a name already. A manager whose
        backlog arrived before any news would otherwise rescan the whole folder every few dozen
        claims (a twentieth of its time, `STALE_FACTOR`) to find names it already holds."""
        self._watched = True
        self.forget_scan()

    def skip(self, name: str) -> None:
        """Never hand out `name` again while it stays in `ready/` (the claimer cannot run it)."""
        self._skipped.add(hash(name))

    def forget_skips(self) -> None:
        """Hand out again the names given back so far (a function was resumed), after a rescan."""
        self._skipped = set()
        self._scanned_at = float("-inf")

    def is_skipped(self, name: str) -> bool:
        """Whether `name` is still being skipped (it stays until a rescan no longer sees it)."""
        return hash(name) in self._skipped

    @property
    def holds_names(self) -> bool:
        """Whether names are in hand (after a scan: whether it found any not skipped)."""
        return bool(self._heap)

    @property
    def watched(self) -> bool:
        """Whether a watcher reports this folder's new names (then scans are only a safety net)."""
        return self._watched

    @property
    def skipped(self) -> int:
        """How many names are being skipped."""
        return len(self._skipped)

    def forget_scan(self) -> None:
        """The watcher lost events (inotify's queue overflowed): names may be missing,
        so rescan before the next pop instead of waiting for the safety net."""
        self._scanned_at = float("-inf")

    def rescan(self) -> None:
        started = time.monotonic()
        seen = 0

        skipped, still_skipped = self._skipped, set()

        def names(entries: Iterator[os.DirEntry[str]]) -> Iterator[str]:
            nonlocal seen
            for entry in entries:
                seen += 1
                if skipped and (key := hash(entry.name)) in skipped:
                    still_skipped.add(key)
                    continue
                yield entry.name

        # Streamed, never listed whole: a list of a million names would leave the allocator
        # holding ~100 MB for the kept strings' sake, and fork cost grows with the manager's RSS.
        with self._scan() as entries:
            kept = heapq.nsmallest(self._keep, names(entries))
        self._skipped = still_skipped
        seen -= len(still_skipped)
        self._keep = min(max(self._limit, seen // KEPT_SHARE), max(self._limit, MAX_KEPT))
        self._complete = len(kept) == seen
        self._bound = kept[-1] if kept else ""
        self._heap = kept  # sorted, hence already a heap
        self._known = set(kept)
        self._scanned_at = time.monotonic()
        self._scan_cost = self._scanned_at - started
        self.scans += 1

    def _worth_rescanning(self) -> bool:
        """With the heap dry: after a scan that kept only part of the folder, at once (the rest
        is waiting); after one that kept it all, once the scan is old next to its own cost."""
        if not self._complete or not self._skipped:
            return True  # nothing skipped: the dry heap means a small or empty folder, cheap to list
        return time.monotonic() - self._scanned_at > STALE_FACTOR * self._scan_cost

    def _is_stale(self) -> bool:
        age = time.monotonic() - self._scanned_at
        min_age = WATCHED_MIN_AGE if self._watched else UNWATCHED_MIN_AGE
        return age > max(STALE_FACTOR * self._scan_cost, min_age)
