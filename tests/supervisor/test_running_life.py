"""A job's child's life as its manager tracks it (`supervisor.running.Life`): the steps its
table allows are the only ones taken; any other is a bug, raised at once; time frozen is
kept out of its timeout."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from jobs import Owner, Queue
from supervisor import InternalError
from supervisor.running import LIFE_STEPS, Life, Running, Stop

STEPS = {
    Life.FROZEN: lambda running: running.freeze(10.0),
    Life.RUNNING: lambda running: running.thaw(12.5),
    Life.STOPPING: lambda running: running.stop(Stop.TIMEOUT, 20.0),
    Life.KILLED: lambda running: running.kill(Stop.DRAIN),
    Life.LOST: lambda running: running.lose(),
}
PATHS = {  # how a child reaches each life from its start
    Life.RUNNING: [],
    Life.FROZEN: [Life.FROZEN],
    Life.STOPPING: [Life.STOPPING],
    Life.KILLED: [Life.KILLED],
    Life.LOST: [Life.LOST],
}


@pytest.fixture
def running(tmp_path: Path) -> Running:
    queue = Queue(tmp_path / "queue")
    queue.enqueue("tests.sample_jobs.add", 1, 2)
    owner = Owner.new()
    queue.serving.register_owner(owner)
    claim = queue.serving.claim(owner.name)
    assert claim is not None
    return Running(pid=4121, claim=claim, started=time.monotonic(), started_wall=time.time())


@pytest.mark.parametrize("start", list(Life))
@pytest.mark.parametrize("to", list(Life))
def test_a_child_takes_only_the_steps_its_table_allows(running: Running, start: Life, to: Life) -> None:
    for step in PATHS[start]:
        STEPS[step](running)
    assert running.life is start
    if to in LIFE_STEPS[start]:
        STEPS[to](running)
        assert running.life is to
    else:
        with pytest.raises(InternalError, match=f"from {start.value} to {to.value}"):
            STEPS[to](running)
        assert running.life is start, "a refused step changed the child's life"


def test_every_life_but_lost_has_a_way_out_and_lost_is_the_end() -> None:
    assert LIFE_STEPS[Life.LOST] == frozenset()
    assert all(Life.LOST in steps for life, steps in LIFE_STEPS.items() if life is not Life.LOST)


def test_time_frozen_is_kept_out_of_the_timeout_and_a_stop_says_why(running: Running) -> None:
    running.freeze(10.0)
    assert running.frozen
    assert running.frozen_since == 10.0
    running.thaw(12.5)
    assert not running.frozen
    assert (running.frozen_for, running.frozen_since) == (2.5, None)
    running.stop(Stop.CANCELLED, 20.0)
    assert (running.stopped, running.kill_at) == (Stop.CANCELLED, 20.0)
    running.kill()
    assert (running.life, running.stopped, running.kill_at) == (Life.KILLED, Stop.CANCELLED, None)
    running.lose()
    assert running.lost
