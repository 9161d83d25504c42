"""Counting while jobs move: a sweeper fences an owner (`claimed/OWNER` renamed to
`claimed/reaping.OWNER`) between `counts()` listing the owners and opening them. The
claimed jobs must still be counted, or a `--burst` manager could see an empty queue
and stop its sweeper half way through returning them (as a CI run once showed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from jobs import Owner, Queue, view
from jobs.lease import REAPING_PREFIX
from tests.jobs.conftest import add


def test_an_owner_fenced_while_counting_is_counted(queue: Queue, owner: Owner, monkeypatch: pytest.MonkeyPatch) -> None:
    queue.enqueue(add, 1, 2)
    assert queue.serving.claim(owner.name) is not None
    claimed = queue.path / "claimed"
    listed = view.owner_dirs

    def fenced_after_listing(folder: Any) -> Iterator[Any]:  # (the queue's folder, its owners' entries)
        found = list(listed(folder))
        if (claimed / owner.name).exists():  # the first listing only: fence it, as a sweeper would
            os.rename(claimed / owner.name, claimed / f"{REAPING_PREFIX}{owner.name}")
        yield from found

    monkeypatch.setattr(view, "owner_dirs", fenced_after_listing)
    assert queue.counts()["claimed"] == 1
