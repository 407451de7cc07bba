"""User-facing errors.

Every error a user can cause is one of these two classes. The CLI prints ``str(err)`` on one line and exits
with ``exit_code``; it never shows a traceback (``--debug`` does).
"""

from __future__ import annotations


class PlannerError(Exception):
    """Bad input: names the file or option, the field, what was wrong and what would be valid. Exit code 2."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None, fix: str | None = None):
        self.source = source
        self.field = field
        self.fix = fix
        self.reason = message
        parts = []
        where = ": ".join(p for p in (source, field) if p)
        if where:
            parts.append(f"{where}: ")
        parts.append(message)
        if fix:
            parts.append(f" ({fix})")
        super().__init__("".join(parts))


class InfeasibleError(PlannerError):
    """The request is well formed but no configuration satisfies it. Exit code 1."""

    exit_code = 1
