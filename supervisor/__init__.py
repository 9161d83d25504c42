"""forkvisor's process side: the manager, its children, the sweeper and the CLI.

`Manager` and `Settings` are imported on first use, so that the `forkvisor`
command can check, before importing anything of `jobs`, that the packages it
finds are forkvisor's (supervisord's import name is also `supervisor`, and a
user's `jobs.py` can shadow `jobs`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from supervisor.errors import AppNotFound, ConfigError, InternalError, SupervisorError

if TYPE_CHECKING:
    from supervisor.manager import Manager, Settings

__forkvisor__ = True  # marks this package as forkvisor's (see supervisor.cli)
__all__ = ["AppNotFound", "ConfigError", "InternalError", "Manager", "Settings", "SupervisorError"]


def __getattr__(name: str) -> Any:
    if name in ("Manager", "Settings"):
        from supervisor import manager

        return getattr(manager, name)
    raise AttributeError(f"module 'supervisor' has no attribute {name!r}")
