"""Exit codes and the one exception type that carries an expected failure to the CLI.

Everything the user can get wrong (bad input, missing files, unreachable things)
is raised as a GpuprovError with a one-line message that says what is wrong and
what to do. cli.main() turns it into that line on stderr and the exit code; a
traceback is shown only with --debug.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    CHECK_FAILED = 1  # the tool ran, and something it checked is wrong
    USAGE = 2  # bad arguments, configuration or input: the tool could not run
    UNREACHABLE = 3  # host(s) unreachable, and nothing else failed
    NEEDS_CHECKOUT = 4  # a command that runs only from a clone (the lab), run from an install
    INTERRUPTED = 130


class GpuprovError(Exception):
    """An expected failure: one clear line for the user, and an exit code."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
