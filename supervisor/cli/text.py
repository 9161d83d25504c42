"""Text that comes from a queue folder, made safe to print on an operator's terminal.

Function names, error messages, host names, command lines, events and job output are
written by whoever could write the queue (a job, a member of a shared queue). Printed
raw, an escape sequence in them could move the cursor, rewrite what the operator
sees, or set the terminal's title; a newline could forge a line of output. Every
human-facing line the CLI prints passes such text through `safe`: control
characters, and the Unicode ones that reorder text, are shown as escapes instead.
JSON output needs nothing (json.dumps escapes them), and `logs` writes a job's
bytes as they are only to a pipe or with --raw.
"""

from __future__ import annotations

import logging
import re

# C0 controls and DEL, C1 controls, the bidirectional overrides and isolates (which can
# make text display in another order than it is read: CVE-2021-42574), and lone
# surrogates (JSON's "\ud800": no encoder writes them, and "\udc9b", a byte the decoder
# could not read, would go out raw: 0x9b is an 8-bit escape).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_KEEPING_LINES = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _escape(found: re.Match[str]) -> str:
    char = found[0]
    code = ord(char)
    if char == "\n":
        return "\\n"
    if char == "\t":
        return "\\t"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` as one line with every control character escaped (`\\x1b`, `\\n`, `\\u202e`)."""
    return _UNSAFE.sub(_escape, str(text))


def safe_lines(text: str) -> str:
    """`text` with its newlines and tabs kept and every other control character escaped
    (a job's output shown on a terminal)."""
    return _UNSAFE_KEEPING_LINES.sub(_escape, text)


class SafeFormatter(logging.Formatter):
    """Log lines whose message cannot carry escape sequences or forged lines (a job's name or
    error in them comes from the queue); tracebacks, which forkvisor makes, stay as they are."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # logging's name
        record.message = safe(record.message)
        return super().formatMessage(record)
