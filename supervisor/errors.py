"""The exceptions of the process side: one root, `SupervisorError`."""

from __future__ import annotations


class SupervisorError(Exception):
    """Root of every error the process side raises on purpose."""


class AppNotFound(SupervisorError):
    """`--app module:registry` does not name an importable Registry."""


class ConfigError(SupervisorError, ValueError):
    """A manager setting is out of range or contradicts another."""


class CannotRunAs(SupervisorError):
    """A job cannot run as the user it is for (`--run-as-submitter`): unknown here, or root
    where its queue does not allow it."""


class NoSuchUser(CannotRunAs):
    """A job is to run as a user this host does not know (`--run-as-submitter`)."""


class Stalled(SupervisorError):
    """A --burst manager made no progress for its stall timeout: the queue's file system kept failing."""


class Unavailable(SupervisorError):
    """What a command needs is not there: an optional extra, an address to listen on."""


class InternalError(SupervisorError):
    """The process side was used out of order: a bug in forkvisor, never the user's doing."""


class CannotRun(SupervisorError):
    """A command job's program could not be started (the outcome's error type)."""


class RunGone(SupervisorError):
    """The run's folder is gone before its process started: a sweeper took the claim back."""
