"""Command jobs: a program to exec instead of a registered Python function.

A command job is an ordinary job whose function is the reserved name
`forkvisor.command`; its `args` are the argv (strings, the program first) and
its `kwargs` may hold `cwd` (a folder to run in) and `env` (variables to add).
So a shell script can submit one in the same format as any other job.

A manager runs it in the job's child with exec (still one fork per job): exit
status 0 is success, 100 means "cannot be completed" (no retry), anything
else a failed attempt. Since a command can do anything its manager's user
can, managers of a shared queue run command jobs only when told to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jobs.errors import InvalidJob
from jobs.job import COMMAND, JobOptions, JobSpec
from jobs.submit import Call


@dataclass(frozen=True)
class Command:
    """What a command job runs."""

    argv: tuple[str, ...]
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, spec: JobSpec) -> Command:
        """The command a spec names; raise InvalidJob saying what is wrong with it."""
        return _checked(spec.args, spec.kwargs)


def command_call(
    argv: Sequence[str],
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    options: JobOptions | None = None,
) -> Call:
    """A `Call` that runs `argv` as a command job (for `Queue.submit` or `enqueue_many`)."""
    kwargs: dict[str, Any] = {}
    if cwd is not None:
        kwargs["cwd"] = cwd
    if env:
        kwargs["env"] = dict(env) if isinstance(env, Mapping) else env  # _checked says what is wrong
    _checked(tuple(argv), kwargs)
    return Call(COMMAND, tuple(argv), kwargs, options or JobOptions())


def _checked(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Command:
    if not args:
        raise InvalidJob("a command job needs a command: its args are the argv, program first")
    for number, arg in enumerate(args):
        if not isinstance(arg, str) or "\0" in arg:
            raise InvalidJob(f"command argument {number} must be a string without NUL bytes, got {arg!r:.60}")
    if not args[0]:
        raise InvalidJob("a command job's program (argument 0) is empty")
    unknown = set(kwargs) - {"cwd", "env"}
    if unknown:
        raise InvalidJob(f"a command job takes only cwd and env, not {', '.join(sorted(unknown))}")
    cwd = kwargs.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd or "\0" in cwd):
        raise InvalidJob(f"a command job's cwd must be a folder path, got {cwd!r:.60}")
    env = kwargs.get("env", {})
    if not isinstance(env, Mapping) or not all(_is_variable(key, value) for key, value in env.items()):
        raise InvalidJob(f"a command job's env must map names (no '=' or NUL) to strings, got {env!r:.80}")
    return Command(tuple(args), cwd, dict(env))


def _is_variable(name: object, value: object) -> bool:
    return (
        isinstance(name, str)
        and bool(name)
        and "=" not in name
        and "\0" not in name
        and isinstance(value, str)
        and "\0" not in value
    )
