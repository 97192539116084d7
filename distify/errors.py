"""Errors a user can hit. Each renders as one line: what, where, and what to do."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input or environment, shown as one line (exit code 2)."""

    exit_code = 2

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None,
                 col: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line
        self.col = col

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path
            if self.line is not None:
                where += f":{self.line}"
                if self.col is not None:
                    where += f":{self.col}"
            where += ": "
        return f"{where}{self.message}"
