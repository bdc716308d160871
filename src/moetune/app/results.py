"""`moetune results show|export`: the history read back, one run with what is derived from its
samples, or runs with every raw sample exported."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from moetune.errors import InputError

if TYPE_CHECKING:
    from moetune.store.db import ResultsDB, Run


@dataclass(frozen=True, slots=True, kw_only=True)
class Shown:
    """A run, what its samples give (``derived``; a layout run's services and contention in
    ``derived["layout"]``) and its samples counted by phase."""

    run: Run
    derived: dict[str, Any]
    samples: dict[str, int]

    def to_json(self) -> dict[str, object]:
        return {"run": self.run.header(), **self.run.to_json(), "derived": self.derived, "samples": self.samples}


def show(run_ref: str, db_path: Path | None = None) -> Shown:
    """RUN (an id, a label: its newest run, or `latest`) with its figures derived again."""
    from moetune.bench.serve.layout_run import is_layout_run, stored_layout_report
    from moetune.report.results_view import derived
    from moetune.store.db import ResultsDB

    with ResultsDB.open(db_path) as db:
        r = db.resolve(run_ref)
        d = derived(r, db.iter_samples(r.id))
        if is_layout_run(r):  # its services' levels, their contention, what was busy
            lay = stored_layout_report(db, r)
            d["layout"] = {**lay["layout"], "levels": lay["levels"]}
        return Shown(run=r, derived=d, samples=db.sample_counts(r.id))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportRequest:
    refs: tuple[str, ...] = ()  # ids, labels, `latest`
    all_runs: bool = False  # every run in the database
    fmt: str = "json"  # md | csv | json (option_defaults.RESULT_FORMATS)
    output: Path | None = None  # None: the stream given
    db_path: Path | None = None


def export(req: ExportRequest, stream: TextIO) -> None:
    """Write the runs with every raw sample to ``req.output`` (or ``stream``). A file is written as
    the samples are read into one beside it, renamed over it at the end: an export that fails half-way
    leaves no half file under the name asked for."""
    from moetune.report.results_view import export_csv, export_json, export_md
    from moetune.store.db import ResultsDB

    write = {"json": export_json, "csv": export_csv, "md": export_md}[req.fmt]
    with ResultsDB.open(req.db_path) as db:
        runs = _runs(db, req.refs, req.all_runs)
        if not req.output:
            write(db, runs, stream)
            return
        output = req.output
        part = output.with_name(output.name + ".part")
        try:
            output.parent.mkdir(parents=True, exist_ok=True)
            with open(part, "w", newline="") as f:
                write(db, runs, f)
            part.replace(output)
        except OSError as e:
            part.unlink(missing_ok=True)
            raise InputError(
                f"cannot write the export to {output}: {e.strerror or e}",
                hint="choose a writable path with -o, or leave -o out for stdout",
            ) from None
        except BaseException:
            part.unlink(missing_ok=True)
            raise


def _runs(db: ResultsDB, refs: tuple[str, ...], all_runs: bool) -> list[Run]:
    if all_runs:
        return list(reversed(db.runs()))
    if not refs:
        raise InputError("name the runs to export (ids, labels or `latest`), or give --all")
    return [db.resolve(r) for r in refs]
