"""Small derived files kept in moetune's cache directory, by kind and key: a hardware file as
validated, a GGUF header as parsed. Each kind keeps its newest entries only; a cache that cannot be
read or written costs speed, never correctness."""

from __future__ import annotations

import os
from pathlib import Path

KEEP = 256  # entries per kind


def _dir(kind: str) -> Path:
    from moetune.paths import cache_dir

    return cache_dir() / kind


def get(kind: str, key: str) -> bytes | None:
    try:
        return (_dir(kind) / key).read_bytes()
    except OSError:
        return None


def put(kind: str, key: str, data: bytes) -> None:
    d = _dir(kind)
    try:
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        tmp.replace(d / key)
        entries = list(d.iterdir())
        if len(entries) > KEEP:
            entries.sort(key=lambda q: q.stat().st_mtime)
            for q in entries[: len(entries) - KEEP]:
                q.unlink(missing_ok=True)
    except OSError:
        pass
