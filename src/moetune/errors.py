"""Errors a user can act on. The CLI prints them as one line and exits with their code."""

from __future__ import annotations


class MoetuneError(Exception):
    """A failure with a message meant for the user (no traceback)."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, details: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.hint = hint
        self.details = details  # supporting lines (log evidence), printed after the hint


class InputError(MoetuneError):
    """Bad input: a file, an option or a combination we cannot use. Exit code 2."""

    exit_code = 2


class RuntimeFailure(MoetuneError):
    """Something failed while running: a build, a launch, a request. Exit code 1."""

    exit_code = 1


REPORT_IT = (
    "this is a bug in moetune, not in your input: please report it with the command line, "
    "`moetune --version` and the files it read"
)


class InternalError(MoetuneError):
    """moetune broke one of its own rules (two of its results disagree): a bug, not the user's
    input. The message says which rule; the hint asks for a report. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = REPORT_IT, details: tuple[str, ...] = ()) -> None:
        super().__init__(message, hint, details)


class MachineBusy(MoetuneError):
    """Other programs keep the machine too busy to measure (`tune`: to rank configurations). Exit code 3."""

    exit_code = 3


def one_line(text: str, limit: int | None = 200) -> str:
    """Text from a file or a peer as part of a one-line message: control characters and line breaks
    escaped, cut to ``limit`` characters (None: not cut)."""
    out = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return out if limit is None or len(out) <= limit else out[:limit] + "..."
