"""Managers sharing one `ready/` try different names of its head (`jobs.index.Share`): each
prefers its share of the next few names, takes the first when none is its own, and a
lone manager keeps the strict order. The rename still decides; this only spreads the
first tries, so that M managers do not all race for the same name."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from jobs import Owner, Queue
from jobs.index import ReadyIndex, Share, Shares


def _index(names: list[str]) -> ReadyIndex:
    @contextlib.contextmanager
    def scan() -> Iterator[Iterator[os.DirEntry[str]]]:
        yield iter([SimpleNamespace(name=name) for name in names])  # type: ignore[misc]

    index = ReadyIndex(scan)
    index.rescan()
    return index


NAMES = [f"100.job-{number:04d}" for number in range(40)]


def test_a_lone_manager_takes_names_in_order() -> None:
    index = _index(NAMES)
    assert [index.pop(rescan=False) for _ in NAMES] == NAMES


def test_a_share_takes_its_first_name_of_the_head_and_leaves_the_rest_in_order() -> None:
    share = Share(4, 2)
    index = _index(NAMES)
    first = index.pop(rescan=False, share=share)
    assert first == next(name for name in NAMES[:8] if share.holds(name))
    assert [index.pop(rescan=False) for _ in NAMES[1:]] == [name for name in NAMES if name != first]


def test_managers_of_different_ranks_try_different_names_of_the_same_head() -> None:
    tried = [_index(NAMES).pop(rescan=False, share=Share(8, rank)) for rank in range(8)]
    owned = [rank for rank in range(8) if any(Share(8, rank).holds(name) for name in NAMES[:16])]
    assert len({tried[rank] for rank in owned}) == len(owned), tried


def test_a_share_never_passes_over_a_higher_priority() -> None:
    share = Share(2, 0)
    low = [name for name in NAMES if share.holds(name)][:3]
    urgent = next(f"050.{name[4:]}" for name in NAMES if not share.holds(f"050.{name[4:]}"))
    index = _index([urgent, *low])
    assert index.pop(rescan=False, share=share) == urgent


def test_a_head_passed_over_too_often_is_taken() -> None:
    """The head's manager is busy: the others take it after a few passes, not never."""
    share = Share(2, 0)
    theirs = next(name for name in NAMES if not share.holds(name))
    mine = [name for name in NAMES if share.holds(name) and name > theirs]
    index = _index([theirs, *mine])
    taken = [index.pop(rescan=False, share=share) for _ in range(share.looked + 1)]
    assert taken[: share.looked] == mine[: share.looked]
    assert taken[share.looked] == theirs


def test_a_share_with_none_of_its_own_in_sight_takes_the_first() -> None:
    share = Share(2, 0)
    theirs = [name for name in NAMES if not share.holds(name)][:3]
    index = _index(theirs)
    assert index.pop(rescan=False, share=share) == theirs[0]


@given(st.sets(st.integers(0, 10**6), min_size=1, max_size=60), st.integers(1, 20), st.data())
def test_with_a_share_every_name_comes_out_once_from_near_the_head(
    numbers: set[int], managers: int, data: st.DataObject
) -> None:
    names = sorted(f"{100 + number % 3}.{number:08d}" for number in numbers)
    share = Share(managers, data.draw(st.integers(0, managers - 1)))
    index, out = _index(names), []
    while (name := index.pop(rescan=False, share=share)) is not None:
        left = sorted(set(names) - set(out))
        assert name in left[: share.looked], "a share picks among the next few names only"
        assert name[:4] == left[0][:4], "and of the head's priority"
        out.append(name)
    assert sorted(out) == names


def test_a_claimer_knows_its_share_from_the_owners_serving_the_queue(tmp_path: Path) -> None:
    """Two managers that looked at the same head each take the name their share predicts,
    and lose a race only when both predictions are the same name."""
    queues = [Queue(tmp_path / "queue"), Queue(tmp_path / "queue", create=False)]
    owners = []
    for queue in queues:
        owner = Owner.new()
        queue.serving.register_owner(owner)
        owners.append(owner.name)
    for number in range(10):
        queues[0].enqueue("f", number)
    head = sorted(os.listdir(tmp_path / "queue" / "ready"))
    ranks = sorted(owners)
    predicted = []
    for owner in owners:
        share = Share(2, ranks.index(owner))
        predicted.append(next((name for name in head[: share.looked] if share.holds(name)), head[0]))
    assert all(queue.serving.has_claimable() for queue in queues)  # both hold the same head
    first = queues[0].serving.claim(owners[0])
    second = queues[1].serving.claim(owners[1])
    assert first is not None
    assert second is not None
    assert f"100.{first.job_id}" == predicted[0]
    collided = predicted[0] == predicted[1]
    assert (f"100.{second.job_id}" == predicted[1]) is not collided
    assert (queues[0].serving.gone, queues[1].serving.gone) == (0, int(collided))


@given(st.lists(st.text(max_size=30), max_size=40), st.text(max_size=30), st.data())
def test_any_owner_names_give_a_share_that_stops_no_claim(owners: list[str], owner: str, data: st.DataObject) -> None:
    """Whatever names other hosts' managers leave in `claimed/`, a share is None or a rank
    within its count, and every name still comes out of the index once."""
    names = sorted(data.draw(st.sets(st.from_regex(r"1[0-9]{2}\.[a-z0-9-]{1,20}", fullmatch=True), max_size=30)))
    share = Shares(lambda: owners).of(owner, 1)
    if share is not None:
        assert 0 <= share.rank < share.managers == len(owners)
    index, out = _index(names), []
    while (name := index.pop(rescan=False, share=share)) is not None:
        out.append(name)
    assert sorted(out) == names
