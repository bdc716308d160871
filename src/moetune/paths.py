"""Where moetune keeps things. Every location can be moved by an environment variable.

- cache (engine builds, downloads): ``MOETUNE_CACHE_DIR``, else the user cache directory
- data (results database, registered engines, run directories): ``MOETUNE_DATA_DIR``, else the
  user data directory
"""

from __future__ import annotations

import os
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
