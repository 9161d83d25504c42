"""An owner's folder in `claimed/`: registering it (its owner file, whose mtime is the
lease's heartbeat, and what it runs), the heartbeat, what it skipped (for `status`), and
retiring it when its manager stops. The jobs it holds are the claimer's (`jobs.claim`);
a dead owner's folder is the sweeper's (`jobs.sweep`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from jobs import files, moves, view
from jobs.errors import ClaimLost
from jobs.folder import QueueFolder
from jobs.job import State, indented_json
from jobs.lease import FUNCTIONS_FILE, OWNER_FILE, OWNER_FILES, SKIPPED_FILES, Owner
from jobs.policy import Functions

log = logging.getLogger(__name__)


def register(folder: QueueFolder, owner: Owner, functions: Functions | None) -> None:
    """Create `claimed/OWNER/` with its owner file (its mtime is the heartbeat) and, given
    `functions`, the list of what it runs. A failed registration leaves nothing behind."""
    staging = folder.tmp / f".owner.{owner.name}"
    try:
        folder.make_dir(staging)
        with staging.open() as made:
            folder.write_new(made / OWNER_FILE, owner.to_json())
            if functions is not None:
                advertised = indented_json({"functions": functions.advertised()})
                folder.write_new(made / FUNCTIONS_FILE, advertised)
        moves.move_on(staging, folder.at(State.CLAIMED) / owner.name, folder.durable)
    except BaseException:
        files.remove_quietly(staging.name, dir_fd=staging.dir.fd)  # our own fresh folder (disk full, say)
        raise


def heartbeat(folder: QueueFolder, owner: str) -> None:
    """`queue.serving.heartbeat`: the owner file's mtime is the lease; gone means reaped."""
    try:
        os.utime(f"{owner}/{OWNER_FILE}", dir_fd=folder.at(State.CLAIMED).fd, follow_symlinks=False)
    except FileNotFoundError:
        raise ClaimLost(
            f"owner {owner} of queue {folder.path} was reaped: a sweeper judged its lease expired "
            "and returned its jobs to the queue"
        ) from None


def record_skipped(
    folder: QueueFolder, owner: str, source: str, skipped: Mapping[str, str], count: int | None = None
) -> None:
    """Keep in `owner`'s folder what it skipped (`source`: "claims" or "sweep"), for
    `forkvisor status`; an owner folder gone meanwhile is no error (nothing to report)."""
    document = {"count": len(skipped) if count is None else count, "skipped": dict(skipped)}
    try:
        with folder.at(State.CLAIMED).sub(owner) as owner_dir:
            folder.write_json(owner_dir / SKIPPED_FILES[source], document)
    except FileNotFoundError:
        pass


def retire(folder: QueueFolder, owner: str) -> None:
    """`queue.serving.retire_owner`: the owner file goes first, then the folder if nothing else is in it."""
    claimed = folder.at(State.CLAIMED)
    try:
        with claimed.sub(owner) as owner_dir:
            if any(view.stray_names(owner_dir)):
                return
            for name in OWNER_FILES:
                files.unlink_if_there(name, owner_dir.fd)
    except FileNotFoundError:
        return  # a sweeper reaped it already
    try:
        os.rmdir(owner, dir_fd=claimed.fd)
    except OSError as exc:
        log.warning("cannot remove owner folder %s: %s", claimed / owner, exc)
