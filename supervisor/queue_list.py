"""The queues a manager serves, as it was given them: opened, each once, with their caps."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from jobs import Queue
from supervisor.errors import ConfigError

QueueLike = Queue | str | os.PathLike[str]


def open_queues(queues: QueueLike | Sequence[QueueLike]) -> list[Queue]:
    """The queues to serve, opened; ConfigError for none, or one given twice."""
    given = [queues] if isinstance(queues, (Queue, str, os.PathLike)) else list(queues)
    if not given:
        raise ConfigError("a manager needs at least one queue to serve")
    opened = [queue if isinstance(queue, Queue) else Queue(queue, create=False) for queue in given]
    seen: dict[tuple[int, int], Queue] = {}
    for queue in opened:
        if (twin := seen.setdefault(queue.serving.identity, queue)) is not queue:
            raise ConfigError(f"{queue.path} is given twice (as {twin.path} too): give each queue once")
    return opened


def queue_caps(queues: list[Queue], caps: Mapping[QueueLike, int]) -> dict[int, int]:
    """Each capped queue's index, with its cap; ConfigError for a queue not served or a cap below 1."""
    indexes: dict[tuple[int, int], int] = {queue.serving.identity: index for index, queue in enumerate(queues)}
    found = {}
    for key, cap in caps.items():
        identity = _identity(key)
        index = None if identity is None else indexes.get(identity)
        if index is None:
            served = ", ".join(str(queue.path) for queue in queues)
            raise ConfigError(f"a concurrency is given for {key}, which this manager does not serve ({served})")
        if not isinstance(cap, int) or cap < 1:
            raise ConfigError(f"the concurrency of {key} must be a whole number, at least 1, got {cap!r}")
        found[index] = cap
    return found


def _identity(queue: QueueLike) -> tuple[int, int] | None:
    if isinstance(queue, Queue):
        return queue.serving.identity
    try:
        found = os.stat(queue)
    except OSError:
        return None
    return found.st_dev, found.st_ino
