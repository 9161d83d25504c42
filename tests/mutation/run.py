"""How many small faults in the modules that decide where a job goes do the tests catch?

    python -m tests.mutation.run [--module jobs/fate.py ...] [--limit N] [--workers N] [--list]

Each mutant (see `mutants.py`) is written into a worktree of HEAD under /tmp and the
module's own tests are run there; a failing test kills it. It always exits 0 when it
could measure: survivors are findings to act on, not a failure of the tool. See README.md.
"""

from __future__ import annotations

import argparse
import functools
import queue
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.mutation import worktree
from tests.mutation.mutants import Mutant, find_mutants
from tests.mutation.worktree import TestRun, Worktree

REPO = Path(__file__).resolve().parents[2]
WORKTREES = "/tmp/fv-mutation-{}"  # one per worker
TIMEOUT_FACTOR = 3.0  # a mutant's tests may take this many times the unmutated run's
MIN_TIMEOUT = 10.0  # but never less: pytest's own start-up varies on a loaded machine
BASELINE_TIMEOUT = 600.0

# The fast test files that exercise each module, the most direct first: -x stops at the
# first failure, so a mutant a direct test kills costs only that test. Each selection runs
# in under a minute unmutated (README.md has the figures); `--tests` overrides them.
CRASH_STATES = "tests/crashstate/test_crash_states.py::test_a_sample_of_a_workload_s_crash_states_keeps_every_guarantee"
TESTS: dict[str, tuple[str, ...]] = {
    "jobs/moves.py": (
        "tests/jobs/test_enqueue.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs/test_sweep.py",
        "tests/jobs/test_depends.py",
        "tests/jobs_processes/test_crash_points.py",
        CRASH_STATES + "[submit]",  # the barriers: only a power cut shows a missing fsync
        CRASH_STATES + "[harvest]",
        "tests/crashstate/test_crash_states.py::test_a_job_moved_on_from_its_claim_has_both_folders_synced",
    ),
    "jobs/fate.py": (
        "tests/jobs/test_decisions.py",
        "tests/jobs/test_finish.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs/test_sweep.py",
        "tests/jobs/test_depends.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_recovery_edges.py",
        "tests/jobs_processes/test_crash_points.py",
        "tests/supervisor/test_outcomes.py",
    ),
    "jobs/claim.py": (
        "tests/jobs/test_decisions.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs/test_finish.py",
        "tests/jobs/test_recovery_edges.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_policy.py",
        "tests/jobs/test_depends.py",
        "tests/jobs/test_keys.py",
        "tests/jobs/test_view_counts_in_motion.py",
        "tests/jobs_processes/test_concurrent_claims.py",
        "tests/jobs_processes/test_crash_points.py",
        "tests/crashstate/test_crash_states.py::test_a_done_job_s_folder_is_synced_between_its_result_s_link_and_its_move",
        "tests/supervisor/test_gate.py",
    ),
    "jobs/counter.py": (  # counted on disk before a run's code runs (guarantee 3), the gate's commit
        "tests/jobs/test_decisions.py",
        "tests/supervisor/test_gate.py",
        "tests/jobs/test_recovery_edges.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs_processes/test_crash_points.py",
        "tests/crashstate/test_crash_states.py::test_a_run_leaves_no_trace_before_its_count_is_on_disk",
        "tests/crashstate/test_crash_states.py::test_a_count_dropped_is_a_run_that_started_uncounted",
        CRASH_STATES + "[drain]",
    ),
    "jobs/sweep.py": (
        "tests/jobs/test_decisions.py",
        "tests/jobs/test_sweep.py",
        "tests/jobs/test_recovery_edges.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_depends.py",
        "tests/jobs/test_view_counts_in_motion.py",
        "tests/jobs/test_queue_folder.py",
        "tests/jobs/test_ticks.py",
        "tests/jobs_processes/test_crash_points.py",
        "tests/supervisor/test_sweeper.py",
        "tests/faults/test_disk_full.py::test_purge_frees_a_full_disk_of_jobs_with_no_output",
        "tests/faults/test_disk_full.py::test_purge_frees_space_on_a_full_disk",
        "tests/faults/test_disk_full.py::test_purge_frees_a_job_s_own_output_when_the_room_kept_is_gone",
        "tests/faults/test_disk_full.py::test_purge_on_a_full_disk_with_nothing_to_free_says_the_disk_is_full",
        "tests/faults/test_disk_full.py::test_a_sweep_on_a_full_disk_runs_every_chore_and_raises_the_first_failure",
    ),
    "jobs/lease.py": (
        "tests/jobs/test_decisions.py",
        "tests/jobs/test_sweep.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_view_counts_in_motion.py",
        "tests/jobs/test_transitions.py",
        "tests/jobs/test_recovery_edges.py",
        "tests/jobs_processes/test_crash_points.py",
        "tests/supervisor/test_liveness.py",
        "tests/supervisor/test_manager.py",
    ),
    "jobs/retry.py": (
        "tests/jobs/test_retry.py",
        "tests/jobs/test_policy.py",
        "tests/jobs/test_finish.py",
        "tests/jobs/test_registry.py",
        "tests/jobs/test_enqueue.py",
        "tests/jobs/test_bad_input.py",
        "tests/jobs/test_settings_commands_waiting.py",
        "tests/supervisor/test_policy_paths.py",
    ),
    "supervisor/harvest.py": (
        "tests/supervisor/test_harvest.py",
        "tests/supervisor/test_outcomes.py",
        "tests/supervisor/test_cancel.py",
        "tests/supervisor/test_run_cost.py",
        "tests/cli/test_command_jobs.py",
        "tests/cli/test_output_limit.py",
    ),
}


@dataclass
class Tally:
    """One module's results."""

    module: str
    tests: tuple[str, ...]
    mutants: int = 0
    killed: int = 0
    timeouts: int = 0  # killed by running past the timeout (counted in `killed` too)
    survivors: list[Mutant] = field(default_factory=list)
    errors: list[tuple[Mutant, str]] = field(default_factory=list)  # the tests could not run: not scored
    skipped: str = ""  # why the module was not measured (its tests fail unmutated)

    @property
    def score(self) -> float | None:
        judged = self.killed + len(self.survivors)
        return self.killed / judged if judged else None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    modules = [_module_path(name) for name in args.module or TESTS]
    chosen = {module: _sample(module, args.limit, args.seed) for module in modules}
    if args.only:  # e.g. the mutants a loaded machine timed out, run again with --min-timeout
        chosen = {
            module: [m for m in found if any(text in m.label for text in args.only)] for module, found in chosen.items()
        }
    if args.list:
        return _list(chosen)
    try:
        return _measure(chosen, args)
    except RuntimeError as exc:  # a worktree that cannot be made or imports the wrong code
        print(f"cannot measure: {exc}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.mutation.run", description="Mutation testing of the modules that decide where a job goes."
    )
    parser.add_argument("--module", action="append", help="a module to mutate, e.g. jobs/fate.py (repeatable)")
    parser.add_argument("--limit", type=int, help="at most N mutants per module, a seeded sample")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--workers", type=int, default=1, help="mutants run at once, one worktree each")
    parser.add_argument("--tests", nargs="+", help="test files to run for every module, instead of the mapping")
    parser.add_argument("--list", action="store_true", help="list the mutants and run nothing")
    parser.add_argument("--keep-worktrees", action="store_true", help="leave the worktrees for the next run")
    parser.add_argument("--only", action="append", help="only the mutants whose label holds this text (repeatable)")
    parser.add_argument("--min-timeout", type=float, default=MIN_TIMEOUT, help="seconds a mutant's tests take at least")
    return parser


def _module_path(name: str) -> str:
    """`jobs/fate.py`, `jobs.fate` or `fate` (a module of the default set) as a path."""
    path = name if name.endswith(".py") else name.replace(".", "/") + ".py"
    if not (REPO / path).exists():
        path = next((known for known in TESTS if Path(known).stem == name), path)
    if not (REPO / path).exists():
        raise SystemExit(f"no module {name!r} in {REPO}")
    return path


def _sample(module: str, limit: int | None, seed: int) -> list[Mutant]:
    """The module's mutants, or a sample of `limit` of them that is the same on every run."""
    found = find_mutants(module, _source(module))
    if limit is None or limit >= len(found):
        return found
    picked = random.Random(f"{seed}:{module}").sample(range(len(found)), limit)
    return [found[index] for index in sorted(picked)]


@functools.cache
def _commit() -> str:
    """HEAD when the run began: mutants and worktrees are both made from it, whatever is
    committed meanwhile."""
    return worktree.git(REPO, "rev-parse", "HEAD").strip()


@functools.cache
def _source(module: str) -> str:
    return worktree.source_at(REPO, _commit(), module)


def _list(chosen: dict[str, list[Mutant]]) -> int:
    for module, found in chosen.items():
        counts = Counter(mutant.operator for mutant in found)
        print(f"{module}: {len(found)} mutants ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
        for mutant in found:
            print(f"  {mutant.label}")
    print(f"summary: {sum(len(found) for found in chosen.values())} mutants in {len(chosen)} modules (nothing run)")
    return 0


def _measure(chosen: dict[str, list[Mutant]], args: argparse.Namespace) -> int:
    started = time.monotonic()
    _warn_uncommitted(list(chosen))
    worktree.become_subreaper()
    count = max(1, min(args.workers, sum(len(found) for found in chosen.values())))
    trees = [Worktree(REPO, Path(WORKTREES.format(index)), index, alone=count == 1) for index in range(count)]
    try:
        for tree in trees:
            tree.prepare(_commit())
        tallies = _run_all(chosen, args.tests, trees, args.min_timeout)
    except KeyboardInterrupt:
        print("interrupted: nothing reported", file=sys.stderr)
        return 130
    finally:
        worktree.stop_all()
        worktree.end_leftovers(None)
        for tree in trees if not args.keep_worktrees else []:
            tree.remove()
    _report(tallies, time.monotonic() - started)
    return 0


def _warn_uncommitted(modules: list[str]) -> None:
    changed = worktree.git(REPO, "status", "--porcelain", "--", *modules).rstrip()
    if changed:
        print(f"note: mutants are made from HEAD; these edits in the checkout are not measured:\n{changed}")


def _run_all(
    chosen: dict[str, list[Mutant]], override: list[str] | None, trees: list[Worktree], min_timeout: float
) -> list[Tally]:
    """Measure each selection's baseline once, then run every mutant against its module's tests."""
    tallies = {module: Tally(module, tuple(override or TESTS.get(module, ()))) for module in chosen}
    baselines: dict[tuple[str, ...], TestRun] = {}
    for tally in tallies.values():
        if not tally.tests:
            tally.skipped = "no tests are mapped to it: give --tests"
            continue
        if tally.tests not in baselines:
            baselines[tally.tests] = _baseline(trees[0], tally.tests)
        baseline = baselines[tally.tests]
        print(f"{tally.module}: baseline {baseline.seconds:.1f}s ({baseline.status}) of {' '.join(tally.tests)}")
        if baseline.status != "passed":
            tally.skipped = f"its tests do not pass unmutated ({baseline.status}):\n{baseline.output[-1500:]}"
    jobs = [
        (tallies[module], mutant, max(min_timeout, TIMEOUT_FACTOR * baselines[tallies[module].tests].seconds))
        for module, found in chosen.items()
        if not tallies[module].skipped
        for mutant in found
    ]
    free: queue.Queue[Worktree] = queue.Queue()
    for tree in trees:
        free.put(tree)
    printing = threading.Lock()
    done = iter(range(1, len(jobs) + 1))

    def run_one(tally: Tally, mutant: Mutant, timeout: float) -> None:
        tree = free.get()
        try:
            tree.write(mutant.module, mutant.apply(_source(mutant.module)))
            result = tree.run_tests(list(tally.tests), timeout)
        finally:
            tree.reset()
            free.put(tree)
        with printing:
            _record(tally, mutant, result)
            print(
                f"[{next(done):>4}/{len(jobs)}] {_verdict(result):<8} {result.seconds:6.1f}s  {mutant.label}",
                flush=True,
            )

    pool = ThreadPoolExecutor(max_workers=len(trees))
    try:
        for future in [pool.submit(run_one, *job) for job in jobs]:
            future.result()  # a failure of the tool itself is raised here, not lost
    except BaseException:  # ^C, or the tool failed: run no more, and end the runs under way
        pool.shutdown(wait=False, cancel_futures=True)
        worktree.stop_all()
        raise
    finally:
        pool.shutdown(wait=True)
    return list(tallies.values())


def _baseline(tree: Worktree, tests: tuple[str, ...]) -> TestRun:
    """The selection run unmutated: its time sets the mutants' timeout. A failure is tried
    once more, and said: a flaky test would otherwise cost the module its measurement (and
    may still kill a mutant that is not caught)."""
    first = tree.run_tests(list(tests), BASELINE_TIMEOUT)
    if first.status == "passed":
        return first
    again = tree.run_tests(list(tests), BASELINE_TIMEOUT)
    failed = [line for line in first.output.splitlines() if line.startswith(("FAILED", "ERROR"))]
    print(f"note: the unmutated tests {first.status} once, then {again.status}: {'; '.join(failed) or first.status}")
    return again


def _record(tally: Tally, mutant: Mutant, result: TestRun) -> None:
    tally.mutants += 1
    if result.status in ("failed", "timeout"):
        tally.killed += 1
        tally.timeouts += result.status == "timeout"
    elif result.status == "passed":
        tally.survivors.append(mutant)
    else:
        tally.errors.append((mutant, result.output))


def _verdict(result: TestRun) -> str:
    return {"failed": "killed", "passed": "SURVIVED"}.get(result.status, result.status)


def _report(tallies: list[Tally], seconds: float) -> None:
    print("\n== results")
    for tally in tallies:
        if tally.skipped:
            print(f"{tally.module}: not measured: {tally.skipped}")
            continue
        score = "n/a" if tally.score is None else f"{tally.score:.1%}"
        print(
            f"{tally.module}: {tally.mutants} mutants, {tally.killed} killed ({tally.timeouts} by timeout), "
            f"{len(tally.survivors)} survived, {len(tally.errors)} errors; score {score}"
        )
        for mutant in tally.survivors:
            print(f"  survived: {mutant.label}")
        for mutant, output in tally.errors:
            tail = " | ".join(output.strip().splitlines()[-3:])
            print(f"  error: {mutant.label}\n    {tail}")
    measured = [tally for tally in tallies if not tally.skipped]
    killed = sum(tally.killed for tally in measured)
    survived = sum(len(tally.survivors) for tally in measured)
    score = f"{killed / (killed + survived):.1%}" if killed + survived else "n/a"
    print(
        f"summary: {len(measured)} modules, {sum(tally.mutants for tally in measured)} mutants, {killed} killed "
        f"({sum(tally.timeouts for tally in measured)} by timeout), {survived} survived, "
        f"{sum(len(tally.errors) for tally in measured)} errors; score {score}; {seconds / 60:.1f} min"
    )


if __name__ == "__main__":
    sys.exit(main())
