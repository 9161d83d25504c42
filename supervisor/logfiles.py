"""Log files that logrotate can move: on SIGHUP the manager reopens them by name
(`forkvisor --log-file PATH run ...`), so the next line goes to a new file while
the rotated one is complete. SIGHUP does nothing else: it reloads neither the app
nor the options (restart the manager for that; a drain lets running jobs finish)."""

from __future__ import annotations

import logging


def reopen() -> int:
    """Reopen every log file of the root logger by its name; return how many."""
    reopened = 0
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            old = handler.setStream(open(handler.baseFilename, "a", encoding=handler.encoding))  # noqa: SIM115
            if old is not None:
                old.close()
            reopened += 1
    return reopened
