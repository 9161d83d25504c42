"""The `forkvisor` command's entry point: check that the packages are forkvisor's, then run.

The check comes before anything of `jobs` is imported. supervisord's import name
is also `supervisor`: pip installs both into one environment without a word,
the second overwriting `supervisor/__init__.py`, and uninstalling either then
breaks the other. A `jobs.py` on the search path shadows forkvisor's `jobs` the
same way. Either way forkvisor refuses with one line (exit 111) instead of
failing later with a traceback that blames something else. The commands
themselves are in `supervisor.cli.program`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from types import ModuleType

EXIT_ENVIRONMENT = 111


def main(argv: Sequence[str] | None = None) -> int:
    problem = foreign_package()
    if problem is not None:
        print(f"forkvisor: {problem}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    from supervisor.cli import program  # only now: it imports jobs

    return program.main(argv)


def foreign_package() -> str | None:
    """Why the `supervisor` or `jobs` this interpreter imports is not forkvisor's, or None."""
    import supervisor

    if not getattr(supervisor, "__forkvisor__", False):
        return (
            f"the package `supervisor` at {_where(supervisor)} is not forkvisor's: supervisord, whose import name "
            "is also `supervisor`, was installed over it; install forkvisor and supervisord in separate "
            "environments (python -m venv), then reinstall forkvisor"
        )
    try:
        import jobs
    except ImportError as exc:
        return f"cannot import forkvisor's package `jobs` ({exc}): is a jobs.py on the search path? rename it"
    if not getattr(jobs, "__forkvisor__", False):
        return (
            f"the module `jobs` at {_where(jobs)} is not forkvisor's and shadows it: rename it (e.g. to tasks.py) "
            "or take its folder off the search path (PYTHONPATH, the current folder with python -m)"
        )
    return None


def _where(module: ModuleType) -> str:
    return str(getattr(module, "__file__", None) or list(getattr(module, "__path__", [])) or "?")
