"""The mutant maker: each operator makes the fault it names, in place, and nothing else;
what must be left alone is. (Running mutants is `run.py`'s, and is not tested here.)"""

from __future__ import annotations

import textwrap

import pytest

from tests.mutation.mutants import Mutant, find_mutants
from tests.mutation.run import REPO, TESTS


def mutants(source: str) -> list[Mutant]:
    return find_mutants("m.py", textwrap.dedent(source))


def changed_lines(source: str, mutant: Mutant) -> list[tuple[str, str]]:
    """The (before, after) pairs of the lines a mutant changes."""
    source = textwrap.dedent(source)
    after = mutant.apply(source)
    assert after.count("\n") == source.count("\n"), "a mutant must keep every line's number"
    return [(a, b) for a, b in zip(source.splitlines(), after.splitlines(), strict=True) if a != b]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("x = a < b\n", "x = a <= b"),
        ("x = a <= b\n", "x = a < b"),
        ("x = a > b\n", "x = a >= b"),
        ("x = a >= b\n", "x = a > b"),
        ("x = a == b\n", "x = a != b"),
        ("x = a != b\n", "x = a == b"),
        ("x = a in b\n", "x = a not in b"),
        ("x = a not in b\n", "x = a in b"),
        ("x = a is b\n", "x = a is not b"),
        ("x = a is not b\n", "x = a is b"),
        ("x = a and b and c\n", "x = a or b or c"),
        ("x = a or b\n", "x = a and b"),
        ("x = not a\n", "x = a"),
        ("x = True\n", "x = False"),
        ("x = 10_000\n", "x = 10001"),
    ],
)
def test_each_expression_operator_makes_its_one_fault(code: str, expected: str) -> None:
    [mutant] = mutants(code)
    assert changed_lines(code, mutant) == [(code.rstrip("\n"), expected)]


def test_a_chained_comparison_gives_one_mutant_per_operator() -> None:
    found = mutants("ok = 0 < n <= top\n")
    assert [m.description for m in found if m.operator == "compare"] == [
        "`0 < n` -> `0 <= n`",
        "`n <= top` -> `n < top`",
    ]


def test_a_return_and_a_bare_call() -> None:
    code = """
    def f(x):
        g(x)
        return x + 1
    """
    found = {m.operator: m for m in mutants(code)}
    assert changed_lines(code, found["drop-call"]) == [("    g(x)", "    pass")]
    assert changed_lines(code, found["return-none"]) == [("    return x + 1", "    return None")]
    assert "swap" not in found  # a return is neither a call nor an assignment


def test_a_dropped_call_over_several_lines_keeps_the_lines_below_in_place() -> None:
    code = """
    def f():
        files.fsync_dir(
            head,
            fd,
        )  # the barrier
        done = True
    """
    [dropped] = [m for m in mutants(code) if m.operator == "drop-call"]
    assert dropped.line == 3
    after = dropped.apply(textwrap.dedent(code)).splitlines()
    assert after[2].strip() == "pass"
    assert after[6].strip() == "done = True"


def test_two_calls_or_dependent_assignments_are_swapped_but_independent_ones_are_not() -> None:
    code = """
    def f(a):
        x = a + 1
        y = 2
        z = x
        save(z)
        note(y)
    """
    swaps = [m.description for m in mutants(code) if m.operator == "swap"]
    # x and y commute (no call, neither reads the other); y/z do too; z/save and save/note do not.
    assert swaps == ["`save(z)` moved above `z = x`", "`note(y)` moved above `save(z)`"]


def test_assignments_to_attributes_of_one_object_commute_unless_one_reads_the_other() -> None:
    code = """
    def f(self, a):
        self.a = a
        self.b = []
        self.c = self.b
    """
    swaps = [m.description for m in mutants(code) if m.operator == "swap"]
    assert swaps == ["`self.c = self.b` moved above `self.b = []`"]


def test_a_lambda_s_body_runs_later_so_its_calls_do_not_keep_a_swap() -> None:
    code = """
    def f(folder):
        chores = [lambda: clean(folder), lambda: count(done)]
        done = {}
        later = [lambda x=measure(): x]
        first = {}
    """
    swaps = [m.description for m in mutants(code) if m.operator == "swap"]
    # chores/done commute (the lambdas read `done` when called); a default is evaluated now.
    assert swaps == [
        "`later = [lambda x=measure(): x]` moved above `done = {}`",
        "`first = {}` moved above `later = [lambda x=measure(): x]`",
    ]


def test_no_return_none_where_the_type_checker_refuses_it() -> None:
    code = """
    def strict(x) -> bool:
        return x > 1
    def loose(x) -> bool | None:
        return x > 2
    def unsure(x):
        return x > 3
    def generic(x: T) -> T:
        return x
    """
    found = [m.description for m in mutants(code) if m.operator == "return-none"]
    assert found == [
        "`return x > 2` -> `return None`",
        "`return x > 3` -> `return None`",
        "`return x` -> `return None`",
    ]


def test_what_is_left_alone() -> None:
    code = '''
    """Docstring with 1 < 2."""
    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        import os
        limit = 3
    log.warning("x %d", 1 < 2)
    files.checkpoint("claim:moved")
    def f(a: int = 5, *, b: bool = True) -> list[int] | None:
        """Returns 1 and 2."""
        y: int
        return g(f"{a > 1}")
    class C:
        def __repr__(self):
            return f"C({1 + 1 > 2})" if self.a == 2 else "C"
        def __str__(self):
            return "c" if self.n > 3 else "C"
    '''
    assert [m.label for m in mutants(code)] == ['m.py:12 return-none: `return g(f"{a > 1}")` -> `return None`']


def test_columns_are_bytes_not_characters() -> None:
    code = 'x = ("é", a < b)\n'
    [mutant] = [m for m in mutants(code) if m.operator == "compare"]
    assert mutant.apply(code) == 'x = ("é", a <= b)\n'


def test_a_constant_is_shown_in_its_expression() -> None:
    found = mutants("f = field(compare=False, repr=False)\n")
    assert [m.description for m in found] == [
        "`f = field(compare=False, repr=False)` -> `f = field(compare=True, repr=False)`",
        "`f = field(compare=False, repr=False)` -> `f = field(compare=False, repr=True)`",
    ]


@pytest.mark.parametrize("module", sorted(TESTS))
def test_every_mutant_of_the_default_modules_keeps_the_lines_and_compiles(module: str) -> None:
    source = (REPO / module).read_text()
    found = find_mutants(module, source)
    assert found, f"{module} gave no mutants"
    assert len({m.label for m in found}) == len(found), "two mutants read the same: a survivor would be ambiguous"
    for mutant in found:
        assert mutant.apply(source).count("\n") == source.count("\n"), mutant.label
