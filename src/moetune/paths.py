"""Where moetune keeps things. Every location can be moved by an environment variable.

- cache (engine builds, downloads): ``MOETUNE_CACHE_DIR``, else the user cache directory
- data (results database, registered engines, run directories): ``MOETUNE_DATA_DIR``, else the
  user data directory
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from platformdirs import user_cache_dir, user_data_dir


def cache_dir() -> Path:
    return Path(os.environ.get("MOETUNE_CACHE_DIR") or user_cache_dir("moetune"))


def data_dir() -> Path:
    return Path(os.environ.get("MOETUNE_DATA_DIR") or user_data_dir("moetune"))


def runs_dir() -> Path:
    return data_dir() / "runs"


def default_db() -> Path:
    return data_dir() / "results.sqlite"


def readable_file(path: str | os.PathLike[str], what: str) -> Path:
    """A path the user named, checked before it is opened: it exists (symbolic links followed, a loop
    said), is a regular file (not a directory, a FIFO that would block, a socket or a device) and can
    be read. Raises InputError with one line that names the problem."""
    from moetune.errors import InputError

    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{p}: no such {what}") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(
                f"{p}: a loop of symbolic links, not a {what}", hint="point the link at the real file"
            ) from None
        raise InputError(f"{p}: cannot read the {what} ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{p}: is a directory, not a {what}", hint="name the file itself") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device"
        raise InputError(f"{p}: is {kind}, not a {what}", hint="name a regular file") from None
    if not os.access(p, os.R_OK):
        raise InputError(f"{p}: permission denied (the {what} is not readable)") from None
    return p
