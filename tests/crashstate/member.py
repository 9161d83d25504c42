"""What a member of a shared queue submits in the take-in workload, run as that member:

    python -m tests.crashstate.member delayed QUEUE        one job an hour ahead
    python -m tests.crashstate.member submit QUEUE ID      a plain, a keyed and a dependent
                                                           job, and a cancel of job ID
    python -m tests.crashstate.member first QUEUE          a first submission: its folder made

Each line printed is what the member was told: `WHAT ID [MORE]`, as the workloads' marks.
"""

from __future__ import annotations

import os
import sys

from jobs import Queue, incoming

# The checker's copy of a crash state renews every file's change time, which the id of a
# member's submission must be dated after (a real disk keeps it): ids dated 3,000 s ahead
# (of the 3,600 s allowed) stay acceptable that long after the recording.
incoming.AHEAD = 3000.0


def main(mode: str, path: str, *rest: str) -> None:
    queue = Queue(path, create=False)
    if mode == "delayed":
        print("delayed", queue.with_options(delay=3600).enqueue("crash.add", 7, 8))
        return
    if mode == "first":  # incoming/UID/ made, and synced, before the submission is told; a second
        print("enqueue", queue.enqueue("crash.add", 4, 5))
        print("enqueue", queue.enqueue("crash.add", 6, 7))
        return
    parent = queue.enqueue("crash.add", 1, 2)
    print("enqueue", parent)
    print("keyed", queue.with_options(key="mk").enqueue("crash.add", 2, 3), f"~{os.getuid()}~mk")  # a member's key
    print("dependent", queue.with_options(depends_on=[parent]).enqueue("crash.add", 0, 0), parent)
    queue.cancel(rest[0])
    print("cancel", rest[0])


if __name__ == "__main__":
    main(*sys.argv[1:])
