"""Small faults in one module's source: found in its AST, made by editing its text in place.

Each mutant is a few byte-range edits of the original text, never an `ast.unparse` of
the tree: every line outside the edit is unchanged and keeps its number, so a survivor's
line is the line a person opens. A mutant that does not compile is dropped.
"""

from __future__ import annotations

import ast
import bisect
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

OPERATORS = ("compare", "boolop", "not", "drop-call", "swap", "int", "bool", "return-none")

# The comparison each operator becomes (a boundary moved, or the test turned round),
# and how its token reads in the text between the two operands.
_FLIPPED: dict[type[ast.cmpop], tuple[bytes, str]] = {
    ast.Lt: (rb"<(?!=)", "<="),
    ast.LtE: (rb"<=", "<"),
    ast.Gt: (rb">(?!=)", ">="),
    ast.GtE: (rb">=", ">"),
    ast.Eq: (rb"==", "!="),
    ast.NotEq: (rb"!=", "=="),
    ast.In: (rb"(?<!\w)in(?!\w)", "not in"),
    ast.NotIn: (rb"(?<!\w)not\s+in(?!\w)", "in"),
    ast.Is: (rb"(?<!\w)is(?!\w)", "is not"),
    ast.IsNot: (rb"(?<!\w)is\s+not(?!\w)", "is"),
}
_LOGGERS = {"log", "logger", "logging"}  # a call on one of these only writes a log line
_HOOKS = {"checkpoint"}  # `files.checkpoint`: a crash test's hook, a no-op in use
_CONTEXT = 80  # a constant is shown within the largest expression around it up to this long


@dataclass(frozen=True)
class Edit:
    """Replace bytes `start:end` of the UTF-8 source with `text`."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Mutant:
    module: str  # its path in the repository, e.g. "jobs/fate.py"
    line: int
    operator: str
    description: str
    edits: tuple[Edit, ...]

    @property
    def label(self) -> str:
        """How a survivor is reported: enough to find it and to see the fault."""
        return f"{self.module}:{self.line} {self.operator}: {self.description}"

    def apply(self, source: str) -> str:
        """The module's text with this fault in it, with as many lines as before."""
        data = source.encode()
        for edit in sorted(self.edits, key=lambda e: e.start, reverse=True):
            replaced = data[edit.start : edit.end]
            # A shorter replacement is padded with newlines so later lines keep their numbers.
            padding = b"\n" * max(0, replaced.count(b"\n") - edit.text.count("\n"))
            data = data[: edit.start] + edit.text.encode() + padding + data[edit.end :]
        return data.decode()


def find_mutants(module: str, source: str) -> list[Mutant]:
    """Every mutant of `source` that compiles and changes the text, in order of position."""
    tree = ast.parse(source)
    finder = _Finder(module, source, tree)
    finder.visit(tree)
    kept: dict[str, Mutant] = {}
    for mutant in sorted(finder.found, key=lambda m: (m.edits[0].start, m.operator)):
        text = mutant.apply(source)
        if text == source or text in kept or not _compiles(text, module):
            continue  # no change, a duplicate of an earlier mutant, or not Python
        kept[text] = mutant
    return list(kept.values())


def _compiles(text: str, module: str) -> bool:
    try:
        compile(text, module, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


class _Finder(ast.NodeVisitor):
    """Walks the tree, skipping what no test should be asked to pin down: docstrings,
    annotations, default arguments, log calls and test hooks, `if TYPE_CHECKING:` and
    `__repr__`/`__str__`. f-strings are skipped too: before Python 3.12 the nodes inside
    one carry no reliable columns."""

    def __init__(self, module: str, source: str, tree: ast.AST) -> None:
        self.module = module
        self.data = source.encode()
        self.line_starts = [0] + [m.end() for m in re.finditer(rb"\n", self.data)]
        self.found: list[Mutant] = []
        self.in_function = False  # whether the block being walked is a function's (see `block`)
        self.returns: list[ast.expr | None] = []  # the return annotations of the functions walked into
        self.parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    # positions and descriptions ----------------------------------------------------

    def span(self, node: ast.AST) -> tuple[int, int]:
        """Bytes `start:end` of `node` in the source (ast columns are UTF-8 byte offsets)."""
        start = self.line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self.line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode()

    def add(self, operator: str, description: str, *edits: Edit) -> None:
        line = bisect.bisect_right(self.line_starts, edits[0].start)
        self.found.append(Mutant(self.module, line, operator, description, edits))

    def replace(self, operator: str, start: int, end: int, edits: list[Edit]) -> None:
        """A mutant made of `edits`, all within bytes `start:end`, described as that code
        before and after (the caller picks a stretch that shows the fault)."""
        before = after = self.data[start:end]
        for edit in sorted(edits, key=lambda e: e.start, reverse=True):
            after = after[: edit.start - start] + edit.text.encode() + after[edit.end - start :]
        self.add(operator, f"`{_short(before.decode())}` -> `{_short(after.decode())}`", *edits)

    def context(self, node: ast.AST) -> tuple[int, int]:
        """The span of the largest one-line code around `node`, up to its statement, that is
        short enough to read: `field(compare=False, repr=False)` rather than a bare `False`
        twice on one line, `self.count = 0` rather than `0`."""
        start, end = self.span(node)
        parent = self.parents.get(node)
        while parent is not None and hasattr(parent, "end_lineno"):
            wider = self.span(parent)
            if b"\n" in self.data[wider[0] : wider[1]] or wider[1] - wider[0] > _CONTEXT:
                break
            start, end = wider
            if isinstance(parent, ast.stmt):
                break
            parent = self.parents.get(parent)
        return start, end

    # what is skipped -------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__repr__", "__str__"):
            return
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.returns.append(node.returns)
        self.scope(node.body, in_function=True)  # not its arguments: their annotations and defaults
        self.returns.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.scope(node.body, in_function=False)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.visit(node.test)
            self.block(node.body)
        self.block(node.orelse)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    def visit_Call(self, node: ast.Call) -> None:
        if not _is_inert(node):
            self.generic_visit(node)

    def generic_visit(self, node: ast.AST) -> None:
        for _, value in ast.iter_fields(node):
            if isinstance(value, list) and value and all(isinstance(item, ast.stmt) for item in value):
                self.block(value)
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, ast.AST):
                        self.visit(item)
            elif isinstance(value, ast.AST):
                self.visit(value)

    # the operators -----------------------------------------------------------------

    def scope(self, body: list[ast.stmt], in_function: bool) -> None:
        outer, self.in_function = self.in_function, in_function
        self.block(body)
        self.in_function = outer

    def block(self, body: list[ast.stmt]) -> None:
        """A block's statements, and the swap of each adjacent pair that order could matter to.
        Only in functions: at module and class level assignments define names, and swapping
        two either fails at import or changes nothing (a person would only explain it away)."""
        for first, second in itertools.pairwise(body):
            if self.in_function and _swappable(first) and _swappable(second) and not _commute(first, second):
                self.swap(first, second)
        for statement in body:
            self.visit(statement)

    def swap(self, first: ast.stmt, second: ast.stmt) -> None:
        start, first_end = self.span(first)
        second_start, end = self.span(second)
        a, between, b = self.text(start, first_end), self.text(first_end, second_start), self.text(second_start, end)
        if a != b:
            self.add("swap", f"`{_short(b)}` moved above `{_short(a)}`", Edit(start, end, b + between + a))

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call) and not _is_inert(node.value):
            start, end = self.span(node)
            self.add("drop-call", f"`{_short(self.text(start, end))}` -> `pass`", Edit(start, end, "pass"))
        self.visit(node.value)  # a docstring is a constant string: nothing in it is mutated

    def visit_Compare(self, node: ast.Compare) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            token, flipped = _FLIPPED[type(op)]
            gap_start, gap_end = self.span(left)[1], self.span(right)[0]
            matches = list(re.finditer(token, self.data[gap_start:gap_end]))
            if len(matches) == 1:  # else a comment in the gap makes it ambiguous: leave it
                edit = Edit(gap_start + matches[0].start(), gap_start + matches[0].end(), flipped)
                self.replace("compare", self.span(left)[0], self.span(right)[1], [edit])  # this pair only
            left = right
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        word, other = (rb"and", "or") if isinstance(node.op, ast.And) else (rb"or", "and")
        edits = []
        for left, right in itertools.pairwise(node.values):
            gap_start, gap_end = self.span(left)[1], self.span(right)[0]
            matches = list(re.finditer(rb"(?<!\w)" + word + rb"(?!\w)", self.data[gap_start:gap_end]))
            if len(matches) != 1:
                break
            edits.append(Edit(gap_start + matches[0].start(), gap_start + matches[0].end(), other))
        else:
            self.replace("boolop", *self.span(node), edits)  # every `and` of the chain at once: one fault
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            start, operand_start = self.span(node)[0], self.span(node.operand)[0]
            match = re.match(rb"not\s*", self.data[start:operand_start])
            if match:
                self.replace("not", *self.span(node), [Edit(start, start + match.end(), "")])
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        start, end = self.span(node)
        written = self.text(start, end)  # checked against the value: a wrong column makes no mutant
        if isinstance(node.value, bool) and written == str(node.value):
            self.replace("bool", *self.context(node), [Edit(start, end, str(not node.value))])
        elif isinstance(node.value, int) and not isinstance(node.value, bool) and _literal(written) == node.value:
            self.replace("int", *self.context(node), [Edit(start, end, str(node.value + 1))])

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        rejected = bool(self.returns) and _rejects_none(self.returns[-1])  # mypy, run by CI, refuses it
        if value is not None and not (isinstance(value, ast.Constant) and value.value is None) and not rejected:
            start, end = self.span(value)
            described = f"`return {_short(self.text(start, end))}` -> `return None`"
            self.add("return-none", described, Edit(start, end, "None"))
        self.generic_visit(node)


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def _is_inert(call: ast.Call) -> bool:
    """A call that only writes a log line (`log.warning(...)`) or marks a point for a crash
    test (`files.checkpoint(...)`): dropping or moving it changes no behaviour under test."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return isinstance(func, ast.Name) and func.id in _HOOKS
    if func.attr in _HOOKS:
        return True
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in _LOGGERS


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _swappable(statement: ast.stmt) -> bool:
    """A call or an assignment, and not one that only logs or marks (its order is no behaviour)."""
    if any(isinstance(node, ast.Call) and _is_inert(node) for node in ast.walk(statement)):
        return False
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Call)
    return isinstance(statement, ast.Assign | ast.AugAssign) or (
        isinstance(statement, ast.AnnAssign) and statement.value is not None
    )


def _commute(first: ast.stmt, second: ast.stmt) -> bool:
    """Two assignments (to names or attributes) that call nothing and read nothing the other
    writes: swapping them changes nothing, so the mutant would only be an equivalent to explain."""
    a, b = _names(first), _names(second)
    if a is None or b is None:
        return False
    (a_writes, a_reads), (b_writes, b_reads) = a, b
    return not (_overlap(a_writes, b_reads | b_writes) or _overlap(b_writes, a_reads))


def _names(statement: ast.stmt) -> tuple[set[str], set[str]] | None:
    """(what it writes, what it reads) of an assignment with no call in it, as dotted names
    (`self.more`); None for any other statement, or a target that is not a dotted name."""
    if not isinstance(statement, ast.Assign | ast.AugAssign | ast.AnnAssign) or statement.value is None:
        return None
    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
    writes = {_dotted(target) for target in targets}
    nodes = list(_evaluated(statement.value))
    effects = ast.Call | ast.Await | ast.Yield | ast.YieldFrom | ast.NamedExpr
    if None in writes or any(isinstance(node, effects) for node in nodes):
        return None
    dotted = {_dotted(node) for node in nodes if isinstance(node, ast.Name | ast.Attribute)}
    reads = {name for name in dotted if name}
    reads = {name for name in reads if not any(other.startswith(name + ".") for other in reads)}  # `self.a`, not `self`
    if isinstance(statement, ast.AugAssign):
        reads |= {name for name in writes if name}  # `x += 1` reads x too
    return {name for name in writes if name}, reads


def _rejects_none(annotation: ast.expr | None) -> bool:
    """Whether a function annotated to return this may not return None, as the type checker
    (which CI runs over both packages) says: a `return None` there is a mutant it kills.
    Unsure (no annotation, a string, `Any`, `object`, a type variable): it may."""
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, str)):
            return False
        if isinstance(node, ast.Name) and (node.id in ("Any", "object", "Optional") or len(node.id) == 1):
            return False
    return True


def _evaluated(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of an expression that run when it is evaluated: a lambda's body runs only
    when it is called (later), so neither its calls nor its reads count here."""
    yield node
    children = (
        [*node.args.defaults, *node.args.kw_defaults] if isinstance(node, ast.Lambda) else ast.iter_child_nodes(node)
    )
    for child in children:
        if child is not None:
            yield from _evaluated(child)


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _overlap(these: set[str], those: set[str]) -> bool:
    """Whether a name in one is a name in the other or a part of it (`self` of `self.more`)."""
    return any(a == b or a.startswith(b + ".") or b.startswith(a + ".") for a in these for b in those)


def _short(text: str, width: int = 80) -> str:
    """One line of at most `width` characters: enough to recognise the code."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
