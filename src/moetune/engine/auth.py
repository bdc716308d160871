"""The API key moetune's own clients send to a server that requires one (``--api-key-file``).

The key is read from the server's key file (the first line that is not empty or a ``#`` comment,
as llama-server reads its keys) when moetune launches the server, or from ``$MOETUNE_API_KEY`` for
a server it did not launch; it is kept in this process's memory only, never in a plan, a log or
the history. Every client (the benchmarks', the health wait's, the sampler's) asks ``headers``.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from moetune.errors import InputError

KEY_ENV = "MOETUNE_API_KEY"
_keys: dict[tuple[str, int], str] = {}  # (host, port) -> key, for the servers launched by this process


def _where(url: str) -> tuple[str, int]:
    u = urlsplit(url)
    return (u.hostname or "", u.port or (443 if u.scheme == "https" else 80))


def read_key_file(path: str | Path) -> str:
    """The first key of a key file; InputError when it cannot be read or holds none."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise InputError(
            f"API key file {path}: cannot read it ({e.strerror})",
            hint="give a readable file with one key per line (--api-key-file)",
        ) from None
    key = next((x.strip() for x in lines if x.strip() and not x.lstrip().startswith("#")), None)
    if key is None:
        raise InputError(f"API key file {path}: no key in it", hint="write one key per line")
    return key


def use_key(url: str, key: str) -> None:
    """Send ``key`` to the server at ``url`` from now on (in this process)."""
    _keys[_where(url)] = key


def key_for(url: str) -> str | None:
    return _keys.get(_where(url)) or os.environ.get(KEY_ENV) or None


def headers(url: str) -> dict[str, str]:
    """The ``Authorization`` header for ``url``, or none."""
    key = key_for(url)
    return {"Authorization": f"Bearer {key}"} if key else {}


def refused_hint(status: int, otherwise: str) -> str:
    """The hint for a server's refusal: how to send a key where it wants one (HTTP 401)."""
    if status != 401:
        return otherwise
    return (
        f"the server requires an API key: bench its plan (moetune sends the key of its --api-key-file), "
        f"or set {KEY_ENV}"
    )
