"""How a long use case tells its caller what it is doing: callbacks, none of them required."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from moetune.bench.single.runner import Progress
    from moetune.monitor.snapshot import Snapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class Callbacks:
    """``status``: a line of what happens now (launching, waiting); ``progress_for``: the progress
    callback of a run, by its label; ``on_snapshot``: the machine's sampled state while a run lasts."""

    status: Callable[[str], None] | None = None
    progress_for: Callable[[str], Progress | None] | None = None
    on_snapshot: Callable[[Snapshot], None] | None = None
