"""Reading fields of stored JSON documents (the typed summaries' ``from_json``): a value of the
expected type, else the empty value, so that an older or hand-edited document still reads."""

from __future__ import annotations

from collections.abc import Mapping


def number(x: object) -> float | None:
    """An int or float (not a bool), else None."""
    return x if isinstance(x, int | float) and not isinstance(x, bool) else None


def integer(x: object) -> int:
    """An int (not a bool), else 0."""
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def mapping(x: object) -> Mapping[str, object]:
    """A mapping, else an empty one."""
    return x if isinstance(x, Mapping) else {}


def optional_integer(x: object) -> int | None:
    """An int (not a bool), else None."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def text(x: object) -> str | None:
    """A str, else None."""
    return x if isinstance(x, str) else None


def flag(x: object) -> bool | None:
    """A bool, else None."""
    return x if isinstance(x, bool) else None
