"""Errors a user can fix. The CLI prints the message on one line and exits with the code (CHANGELOG.md: exit codes)."""


class UserError(Exception):
    """Bad input or environment: names the file, field or command to fix. Exit code 2."""

    exit_code = 2
