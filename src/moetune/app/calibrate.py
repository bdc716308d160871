"""`moetune calibrate`: fit the speed model's constants to the benchmarks of plans in the history,
per hardware and engine kind, and store each fit that is no worse than the built-in constants."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError

if TYPE_CHECKING:
    from moetune.plan.calibrate import Calibration
    from moetune.store.db import Run

Warn = Callable[[str, str], None]  # (message, remedy)


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateRequest:
    refs: tuple[str, ...] = ()  # the runs to fit (default: every benchmark of a plan)
    include_contended: bool = False
    force: bool = False  # store a fit whose stated uncertainty is worse than the built-in constants'
    db_path: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Fit:
    """One hardware and engine kind's calibration, and its stored entry (``applied``; ``not_applied``: why not)."""

    hardware: str | None
    engine: str
    calibration: Calibration
    entry: dict[str, Any]
    placements: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibrated:
    fits: list[Fit]
    left_out: list[Run] = field(default_factory=list)  # contended runs not fitted

    def to_json(self) -> dict[str, object] | list[dict[str, object]]:
        docs: list[dict[str, object]] = [{**f.entry, "left_out_runs": [r.id for r in self.left_out]} for f in self.fits]
        return docs[0] if len(docs) == 1 else docs

    @property
    def applied(self) -> bool:
        return any(f.entry["applied"] for f in self.fits)


def calibrate(req: CalibrateRequest, *, warn: Warn | None = None) -> Calibrated:
    """Fit and store; ``warn`` is told of the contended runs left out before anything is fitted."""
    from moetune.store.db import ResultsDB
    from moetune.tune.history import calibrate_and_save, gather, placements, plan_prior

    left: list[Run] = []
    with ResultsDB.open(req.db_path) as db:
        groups = gather(
            db,
            [db.resolve(r) for r in req.refs] if req.refs else None,
            include_contended=req.include_contended,
            left_out=left,
        )
        if left and warn is not None:
            warn(
                f"left out {len(left)} contended run{'s' if len(left) > 1 else ''}: "
                + "; ".join(
                    f"run {r.id} ({r.label}): " + (r.contention.message() if r.contention else "") for r in left[:3]
                )
                + ("; ..." if len(left) > 3 else ""),
                "benchmark them again on a quiet machine, or give --include-contended",
            )
        if not groups:
            raise InputError(
                "no benchmark of a plan to calibrate on"
                + (" among those runs" if req.refs else "")
                + (f" ({len(left)} contended left out)" if left else ""),
                hint="benchmark a plan first (`moetune bench plan.json`): runs of a bare URL carry no "
                "prediction to compare with" + ("; --include-contended fits contended runs" if left else ""),
            )
        places = {k: placements(db, tuple(sorted({o.run for o in obs}))) for k, obs in groups.items()}
        priors = {k: plan_prior(db, obs) for k, obs in groups.items()}
    fits = []
    for (hardware, engine), obs in groups.items():
        cal, entry = calibrate_and_save(
            (hardware, engine),
            obs,
            priors[(hardware, engine)],
            placements=places[(hardware, engine)],
            left_out=len(left),
            force=req.force,
        )
        fits.append(
            Fit(hardware=hardware, engine=engine, calibration=cal, entry=entry, placements=places[(hardware, engine)])
        )
    return Calibrated(fits=fits, left_out=left)
