"""Editing an engine argv: the server's arguments reused by the engine's other programs
(llama-sweep-bench, llama-fit-params, llama-perplexity), which parse the same common options but
serve nothing.

:data:`SERVING_WITH_VALUE` and :data:`SERVING_ALONE` are the one rule for which of the server's
flags those programs lack: each was tried as ``llama-perplexity FLAG [VALUE] --version`` on
llama.cpp build 11434 and refused (``--no-warmup`` parses but means nothing without a server)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# serving flags the other programs reject or have no use for: (flags with a value, flags alone)
SERVING_WITH_VALUE = frozenset(
    {
        "--host",
        "--port",
        "-a",
        "--alias",
        "--api-key",
        "--api-key-file",
        "--chat-template-kwargs",
        "--reasoning-budget",
        "--threads-http",
        "--timeout",
        "--ctx-checkpoints",
        "-cram",
        "--cache-ram",
        "--cache-reuse",
        "--slot-save-path",
    }
)
SERVING_ALONE = frozenset(
    {
        "--jinja",
        "--metrics",
        "--no-warmup",
        "--cont-batching",
        "-cb",
        "--slots",
        "--no-slots",
        "--props",
        "--webui",
        "--no-webui",
    }
)


def strip_flags(
    argv: Sequence[str], with_value: Iterable[str] = SERVING_WITH_VALUE, alone: Iterable[str] = SERVING_ALONE
) -> list[str]:
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
