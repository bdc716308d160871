"""`moetune report`: one self-contained HTML page of a plan, its runs and their comparison."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moetune.errors import InputError


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRequest:
    refs: tuple[str, ...] = ()  # runs (id, label, `latest`) and plan files
    sweep: str | None = None  # the runs of this sweep
    paired: bool = False  # the runs named were made in alternation
    db_path: Path | None = None
    generated_at: str | None = None  # the page's time stamp, ISO 8601 (default: now, in UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    page: str  # the HTML

    @property
    def size_kib(self) -> float:
        return len(self.page.encode()) / 1024


def report(req: ReportRequest) -> Report:
    """Gather the plan, the runs and their comparison from the history, and render the page."""
    from datetime import UTC, datetime

    from moetune import __version__
    from moetune.report.html.gather import gather
    from moetune.report.html.page import render_page

    data = gather(
        req.refs,
        req.db_path,
        generated_at=req.generated_at or datetime.now(UTC).isoformat(timespec="seconds"),
        version=__version__,
        sweep=req.sweep,
        paired=req.paired,
    )
    return Report(page=render_page(data))


def write(rep: Report, path: Path) -> Path:
    """Write the page (its folders made); InputError where it cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rep.page)
    except OSError as e:
        raise InputError(
            f"cannot write the report to {path}: {e.strerror or e}", hint="choose a writable FILE.html with -o"
        ) from None
    return path
