"""Editing an engine argv: the server's arguments reused by the engine's other programs
(llama-sweep-bench, llama-fit-params), which parse the same common options but serve nothing."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# serving flags the other programs reject or have no use for: (flags with a value, flags alone)
SERVING_WITH_VALUE = frozenset({"--host", "--port", "-a", "--alias"})
SERVING_ALONE = frozenset({"--jinja", "--metrics", "--no-warmup", "--cont-batching", "-cb"})


def strip_flags(argv: Sequence[str], with_value: Iterable[str] = SERVING_WITH_VALUE,
                alone: Iterable[str] = SERVING_ALONE) -> list[str]:
    """``argv`` without the given flags (and the value after each of ``with_value``)."""
    valued, single = set(with_value), set(alone)
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in valued and i + 1 < len(argv):
            skip = True
            continue
        if a not in single:
            out.append(a)
    return out
