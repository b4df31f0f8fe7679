"""Errors a user can act on.

A ``UserError`` is printed by the CLI as one line (no traceback) and mapped to a
non-zero exit code. Its message names the file, the field and the fix.
"""


class UserError(Exception):
    """Bad input or a missing prerequisite; the message says what to do."""

    exit_code = 2


class MissingBinaryError(UserError):
    """A llama.cpp tool the tuner needs is not where it looked."""

    exit_code = 3
