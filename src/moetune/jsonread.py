"""Reading fields of JSON documents in the core packages (a plan file, a run record, a tool's
output): a value of the expected type, else the empty value, so that an older or hand-edited
document still reads. One module for every package (the typed summaries' ``from_json`` too)."""

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


def mappings(x: object) -> list[Mapping[str, object]]:
    """The mappings of a list (other entries left out), else an empty list."""
    return [m for m in x if isinstance(m, Mapping)] if isinstance(x, list) else []


def strings(x: object) -> list[str]:
    """The entries of a list as strings, else an empty list."""
    return [str(s) for s in x] if isinstance(x, list | tuple) else []


def real(x: object) -> float:
    """A number (or a numeric string) as a float, for a reader that refuses a malformed document:
    TypeError for anything else (ValueError for a string that is no number)."""
    if isinstance(x, bool) or not isinstance(x, int | float | str):
        raise TypeError(f"expected a number, got {x!r}")
    return float(x)


def optional_integer(x: object) -> int | None:
    """An int (not a bool), else None."""
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def text(x: object) -> str | None:
    """A str, else None."""
    return x if isinstance(x, str) else None


def flag(x: object) -> bool | None:
    """A bool, else None."""
    return x if isinstance(x, bool) else None
