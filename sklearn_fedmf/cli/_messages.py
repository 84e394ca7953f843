"""User errors and the one-line messages the ``fedmf`` command prints on stderr."""

import sys


class CommandError(Exception):
    """A user error: printed as one line, exit status 1."""


def _one_line(exc):
    text = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, (CommandError, ValueError, OSError)):
        return text
    return f"{type(exc).__name__}: {text}"


def _note(message):
    print(f"fedmf: note: {message}", file=sys.stderr)
