"""Enqueue some jobs and serve them with a manager, using the Python API.

    python examples/manager.py [QUEUE]        (default: ./example-queue)

Stop it with Ctrl-C (drain: running jobs finish) or run it as is: it exits
once the queue is empty (burst mode).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from examples.tasks import flaky, registry, slow, word_count
from jobs import Queue
from supervisor import Manager


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    queue = Queue(sys.argv[1] if len(sys.argv) > 1 else "example-queue")
    queue.enqueue(word_count, __file__)
    queue.enqueue(word_count, "/no/such/file")  # ends in dead/: cannot be completed
    for _ in range(3):
        queue.enqueue(flaky, 0.5)
    queue.with_options(priority=10).enqueue(slow, 0.5)  # jumps the line
    Manager(queue, registry, concurrency=2, lease=10, sweep_interval=1).run(burst=True)
    print(queue.counts())
    return 0


if __name__ == "__main__":
    sys.exit(main())
