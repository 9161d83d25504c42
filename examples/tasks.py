"""Example jobs: import this registry in a manager with `--app examples.tasks:registry`.

Names are given explicitly: the default, `module.qualname`, depends on how the
module was imported (`tasks` from a script, `examples.tasks` from the CLI),
and a job enqueued under one name cannot run under the other.
"""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

import tenacity

from jobs import CannotComplete, Registry, current

registry = Registry()


@registry.job(name="examples.word_count", max_attempts=2)
def word_count(path: str) -> dict[str, int]:
    """Count lines and words of a text file; a missing file can never succeed."""
    file = Path(path)
    if not file.is_file():
        raise CannotComplete(f"{path} does not exist or is not a file")
    text = file.read_text(errors="replace")
    return {"lines": text.count("\n"), "words": len(text.split())}


@registry.job(name="examples.sha256", timeout=60)
def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@registry.job(name="examples.flaky", max_attempts=5, backoff=tenacity.wait_exponential(multiplier=0.1, max=2))
def flaky(chance: float = 0.5) -> str:
    """Fail at random, like a call to an unreliable service; retried with backoff."""
    if random.random() < chance:
        raise ConnectionError("the service did not answer (simulated)")
    return "ok"


@registry.job(name="examples.slow", timeout=30)
def slow(seconds: float) -> float:
    """Take a while, printing each step to the attempt's stdout and saying how far it is
    (`forkvisor status`, `show`, `wait` and the web page show it)."""
    steps = int(seconds * 10)
    for step in range(steps):
        print(f"step {step}", flush=True)
        current().progress(step + 1, steps, f"step {step + 1} of {steps}")
        time.sleep(0.1)
    return seconds
