"""Power loss, proven by sample: each workload's file-system operations are recorded (strace),
a sample of the distinct states a power cut could leave under both models is recovered
with forkvisor's own tools, and every guarantee is checked (`check`). The full run, every
distinct state: `python -m tests.crashstate.run` (docs/RELIABILITY.md has its figures).
And the checker itself can fail: a state that drops an operation the code did make
durable breaks a guarantee, and is reported."""

from __future__ import annotations

import copy
import pwd
import random
import shutil
from pathlib import Path

import pytest

from tests.crashstate import check, crash, model
from tests.crashstate.run import Recorded, check_states, record
from tests.crashstate.workloads import RECOVERY, WORKLOADS, Recovery
from tests.users import ALICE, why_no_users

QUICK = 12  # distinct states checked per workload in the default suite

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed (Debian: strace)")


class Recordings(dict[str, Recorded]):
    """Each workload recorded once, when a test first needs it."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def __missing__(self, name: str) -> Recorded:
        if name in NEEDS_USERS and (why := why_no_users()) is not None:
            pytest.skip(why)
        self[name] = recorded = record(name, self.folder / name)
        return recorded


NEEDS_USERS = {"takein", "member"}  # a shared queue, and a member who submits to it
# In the slow suite (CI runs it): take-in's states are recovered a minute after they are made
# (Recovery.aged); reap's wait out a lease each, harvest's are the most (20-40 s each); drain's
# sample took 35-38 s, the longest of the default suite, which stays under ten minutes.
SLOW = {"takein", "reap", "harvest", "drain"}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    return Recordings(tmp_path_factory.mktemp("recordings"))


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=[pytest.mark.slow] if name in SLOW else []) for name in sorted(WORKLOADS)]
)
def test_a_sample_of_a_workload_s_crash_states_keeps_every_guarantee(
    recordings: Recordings, tmp_path: Path, name: str
) -> None:
    recorded = recordings[name]
    assert recorded.replayed_exactly, (
        "the recorded operations do not rebuild the workload's folder: the recorder lost some"
    )
    assert sum(op.kind == "mark" for op in recorded.ops) + len(recorded.marks_before) >= 2, "nothing acknowledged"
    report = check_states(recorded, tmp_path, limit=QUICK, seed=len(name))
    assert report.distinct > 3, report.line()
    assert report.checked == min(QUICK, report.distinct), report.line()
    assert report.violations == [], report.line() + "\n" + "\n".join(report.violations[:20])


def test_a_synced_publish_dropped_loses_an_acknowledged_job(recordings: Recordings, tmp_path: Path) -> None:
    """The checker can fail: drop the durable rename that published the first acknowledged
    job, and the job is lost."""
    recorded = recordings["submit"]
    ack = next(index for index, op in enumerate(recorded.ops) if op.kind == "mark")
    job_id = recorded.ops[ack].text.split()[2]
    published = next(
        index for index, op in enumerate(recorded.ops[:ack]) if op.kind == "rename" and op.name2.endswith(job_id)
    )
    assert published in crash.durable(recorded.ops, ack), "the publish was synced before the acknowledgment"
    kept = [index for index in range(ack) if recorded.ops[index].kind not in ("sync", "mark") and index != published]
    tree = crash._tree(recorded.ops, recorded.initial, kept)
    tree.materialize(tmp_path / "queue")
    found = check.violations(tmp_path / "queue", [recorded.ops[ack].text], tmp_path / "tools.log", recover=False)
    assert found == [f"acknowledged job {job_id} is in 0 places: []"]


def test_a_synced_result_dropped_leaves_a_done_job_without_it(recordings: Recordings, tmp_path: Path) -> None:
    """And again: drop the durable link of a done job's result.json, and the recovered
    queue has a done job without its result."""
    found = _without_first_durable_rename_to(recordings["harvest"], "result.json", tmp_path)
    assert any("has no result.json" in problem for problem in found), found


def test_an_operation_is_durable_only_once_a_later_barrier_covers_its_unit() -> None:
    ops = [
        model.Op("add", 0, ("dir", 1), 1, "a", 2, "d"),
        model.Op("write", 1, ("data", 3), ino=3, data=b"x"),
        model.Op("sync", 2, ("dir", 1)),
        model.Op("rename", 3, ("dir", 4), 1, "a", 2, dir2=4, name2="b"),
        model.Op("sync", 4, ("dir", 1)),  # the rename's source: a whole rename is durable
        model.Op("add", 5, ("dir", 1), 1, "c", 5, "f"),
    ]
    assert crash.durable(ops, 2) == set()
    assert crash.durable(ops, 3) == {0}
    assert crash.durable(ops, 6) == {0, 3}
    assert crash.points(ops) == [0, 1, 2, 3, 4, 5, 6]


def test_the_weak_model_yields_states_the_ordered_one_does_not(recordings: Recordings) -> None:
    recorded = recordings["submit"]
    found = {state.model for state in crash.states(recorded.ops[:40], recorded.initial, random.Random(1))}
    assert found == {crash.WEAK, crash.ORDERED}


def test_a_rename_of_an_entry_whose_making_was_lost_is_lost_too() -> None:
    """A disk keeps no rename of an entry it never had (ready -> claimed lost, claimed -> done
    kept would put a job in two places): such subsets are not states; and what a durable
    rename moved is durable with it."""
    ops = [
        model.Op("rename", 0, ("dir", 3), 2, "job", 9, dir2=3, name2="job"),  # ready -> claimed, unsynced
        model.Op("rename", 1, ("dir", 4), 3, "job", 9, dir2=4, name2="job", needs=0),  # claimed -> done
        model.Op("sync", 2, ("dir", 4)),
    ]
    initial = model.Tree()
    for number in (2, 3, 4):
        initial.inodes[number] = model.Inode("d", 0o755)
        initial.inodes[1].entries[f"d{number}"] = number
    initial.inodes[9] = model.Inode("d", 0o755)
    initial.inodes[2].entries["job"] = 9
    assert crash.durable(ops, 3) == {0, 1}
    only_the_second = crash._tree(ops, initial, [1])
    assert only_the_second.inodes[2].entries == {"job": 9}  # still where it was, once
    assert only_the_second.inodes[4].entries == {}


def test_a_job_moved_on_from_its_claim_has_both_folders_synced(recordings: Recordings) -> None:
    """`moves.move_on` makes both folders durable, the one a job left and the one it entered:
    on a file system that writes each folder's blocks on its own fsync (ext2, ext4 without
    a journal), a rename made durable only in the folder it entered can come back in both
    after a cut, and one made durable only in the folder it left, in neither. The model keeps
    renames whole, so this is checked on the recording itself: every move out of a claim
    into done/, dead/ or a waiting folder is followed by an fsync of each of its folders."""
    recorded = recordings["harvest"]
    tree = copy.deepcopy(recorded.initial)
    ends = {tree.lookup([name]): name for name in ("done", "dead", "ready", "scheduled")}
    claimed = tree.lookup(["claimed"])
    moves = []  # (index, op) of each job folder's move out of a claim
    for index, op in enumerate(recorded.ops):
        leaves_a_claim = op.kind == "rename" and op.dir2 in ends and claimed in _parents(tree, op.dir)
        if leaves_a_claim and tree.inodes[op.ino].kind == "d":
            moves.append((index, op))
        tree.apply(op)
    assert len(moves) >= 4, "the harvest moves jobs on from their claims (done, a retry, a burial)"
    for (index, op), (following, _) in zip(moves, [*moves[1:], (len(recorded.ops), None)], strict=True):
        synced = {later.unit for later in recorded.ops[index + 1 : following] if later.kind == "sync"}
        missing = [folder for folder in (op.dir, op.dir2) if ("dir", folder) not in synced]
        assert not missing, f"the move of {op.name} to {ends[op.dir2]}/ left {missing} unsynced before the next"


def test_a_done_job_s_folder_is_synced_between_its_result_s_link_and_its_move(recordings: Recordings) -> None:
    """The power-loss fix, on the recording itself: each `result.json` renamed into a claimed
    job's folder is made durable by an fsync of that folder before the folder moves to
    `done/` (without it, a cut can leave a done job without its result, for ever)."""
    recorded = recordings["harvest"]
    tree = copy.deepcopy(recorded.initial)
    done, claimed = tree.lookup(["done"]), tree.lookup(["claimed"])
    linked: dict[int, int] = {}  # job folder -> index of its result's rename into place
    checked = 0
    for index, op in enumerate(recorded.ops):
        if op.kind == "rename" and op.name2 == "result.json" and claimed in _parents(tree, op.dir2):
            linked[op.dir2] = index
        elif op.kind == "rename" and op.dir2 == done and op.ino in linked:
            since = recorded.ops[linked.pop(op.ino) + 1 : index]
            assert any(later.kind == "sync" and later.unit == ("dir", op.ino) for later in since), (
                f"job {op.name} moved to done/ before its folder was synced after its result's link"
            )
            checked += 1
        tree.apply(op)
    assert checked >= 2, "the harvest completes jobs with results"


def test_a_run_leaves_no_trace_before_its_count_is_on_disk(recordings: Recordings) -> None:
    """The gate, on the recording itself: a durable manager forks a run's child before its
    count is on disk, and the child waits; the first file it makes in its run's folder (its
    output, its pid) comes after the rename that put the count in place was made durable.
    (Without the wait, a cut could keep a run that started and lose its count.)"""
    recorded = recordings["harvest"]
    tree = copy.deepcopy(recorded.initial)
    counted: dict[int, int] = {}  # job folder -> index of its latest count's rename into place
    checked = 0
    for index, op in enumerate(recorded.ops):
        if op.kind == "rename" and op.name2 == "attempts":
            counted[op.dir2] = index
        elif op.kind == "add" and op.name == "stdout":
            job = next(folder for folder in counted if folder in _parents(tree, op.dir))
            assert counted[job] in crash.durable(recorded.ops, index), (
                f"a run of job folder {job} wrote its output before its count was on disk"
            )
            checked += 1
        tree.apply(op)
    assert checked >= 4, "the harvest starts several runs"


def test_a_count_dropped_is_a_run_that_started_uncounted(recordings: Recordings, tmp_path: Path) -> None:
    """And the checker sees it: drop the durable rename of the first count, keep the rest."""
    found = _without_first_durable_rename_to(recordings["harvest"], "attempts", tmp_path)
    assert any("runs started" in problem for problem in found), found


def test_a_members_new_folder_is_on_disk_before_its_first_submission_is_told(
    recordings: Recordings, tmp_path: Path
) -> None:
    """A member cannot fsync `incoming/` (they may only pass through it): their folder, made
    as they first submit, is synced through the file system before the submission is
    told. Without it, a cut could keep the told submission's name and lose its folder."""
    recorded = recordings["member"]
    folder = str(pwd.getpwnam(ALICE).pw_uid)  # incoming/UID
    made = [index for index, op in enumerate(recorded.ops) if op.kind == "rename" and op.name2 == folder]
    told = next(index for index, op in enumerate(recorded.ops) if op.kind == "mark")
    assert made, "the member's folder is made as it first submits"
    assert made[0] < told
    assert made[0] in crash.durable(recorded.ops, told), "its folder was not on disk when its submission was told"
    found = _without_first_durable_rename_to(recorded, folder, tmp_path)
    assert any("is in 0 places" in problem for problem in found), found


def _without_first_durable_rename_to(recorded: Recorded, name: str, tmp_path: Path) -> list[str]:
    """The problems of the workload's end state less its first durable rename onto `name`
    (every other operation kept)."""
    end = len(recorded.ops)
    renamed = [
        index
        for index, op in enumerate(recorded.ops)
        if op.kind == "rename" and op.name2 == name and index in crash.durable(recorded.ops, end)
    ]
    assert renamed, f"no durable rename onto {name} in the {recorded.name} recording"
    kept = [index for index in range(end) if recorded.ops[index].kind not in ("sync", "mark") and index != renamed[0]]
    crash._tree(recorded.ops, recorded.initial, kept).materialize(tmp_path / "queue")
    marks = recorded.marks_before + [op.text for op in recorded.ops if op.kind == "mark"]
    options = RECOVERY.get(recorded.name, Recovery()).options
    return check.violations(tmp_path / "queue", marks, tmp_path / "tools.log", options=options)


def _parents(tree: model.Tree, number: int) -> set[int]:
    """The folders above inode `number` (itself included)."""
    above = {number}
    changed = True
    while changed:
        changed = False
        for parent, inode in tree.inodes.items():
            if parent not in above and any(child in above for child in inode.entries.values()):
                above.add(parent)
                changed = True
    return above
