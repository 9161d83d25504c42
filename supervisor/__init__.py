"""forkvisor's process side: the manager, its children, the sweeper and the CLI."""

from supervisor.errors import AppNotFound, ConfigError, SupervisorError
from supervisor.manager import Manager, Settings

__all__ = ["AppNotFound", "ConfigError", "Manager", "Settings", "SupervisorError"]
