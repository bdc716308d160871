"""Progress on stderr for the commands that measure: a bar per run and the machine's live line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from moetune.cli.common import err

if TYPE_CHECKING:
    from moetune.app.progress import Callbacks
    from moetune.bench.single.runner import Progress as ProgressFn
    from moetune.monitor.snapshot import Snapshot


class Bars:
    """Progress on stderr: one bar per run (``bars(label)`` makes its callback) and, under them, the
    live line of the machine and the load (``bars.machine``, fed the sampler's snapshots)."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def __call__(self, label: str) -> ProgressFn:
        bar = self.progress
        task: Any = None

        def cb(what: str, done: int, total: int) -> None:
            nonlocal task
            if task is None:
                task = bar.add_task(label, total=total, what="")
            bar.update(task, completed=done, what=what)

        return cb

    def machine(self, snap: Snapshot) -> None:
        from moetune.report.live_view import live_line

        self.progress.machine_line = live_line(snap)
        self.progress.refresh()


@contextmanager
def progress_bar(enabled: bool = True, bars: bool = True) -> Iterator[Bars]:
    """:class:`Bars` on stderr (nothing shown unless ``enabled``; without ``bars``, the live line alone)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class WithMachine(Progress):
        machine_line = ""

        def get_renderables(self) -> Iterator[Any]:
            if self.tasks:
                yield self.make_tasks_table(self.tasks)
            if self.machine_line:
                yield Text(self.machine_line, style="dim", overflow="ellipsis", no_wrap=True)

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TextColumn("[dim]{task.fields[what]}"),
    )
    with WithMachine(
        *columns, console=err, disable=not enabled or (not err.is_terminal and not bars), transient=not bars
    ) as bar:
        try:
            yield Bars(bar)
        finally:
            bar.machine_line = ""  # the live line goes; the bars stay


def callbacks(bars: Bars) -> Callbacks:
    """The use cases' callbacks: status lines dim on stderr, a bar per run, the live line."""
    from moetune.app.progress import Callbacks

    return Callbacks(status=lambda s: err.print(f"[dim]{s}[/]"), progress_for=bars, on_snapshot=bars.machine)
