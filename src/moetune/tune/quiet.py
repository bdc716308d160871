"""Whether the machine is quiet enough for `tune` to rank candidates (:mod:`moetune.contention`).

A search ranks candidates by differences of a few percent; on a machine where another program
takes cores it measures that program (a busy testbed measured 9.3 tok/s for a plan that gives
325, then stopped with "no candidate expects to gain more than the noise"). So before each launch
the foreign load is measured over :data:`WINDOW_S` (no engine runs then: everything but moetune
is foreign), and each measurement's own accounting is read when it ends. Above the threshold
(``MOETUNE_MAX_FOREIGN_CORES``, 0.5 cores by default) the search stops with :class:`MachineBusy`
(exit code 3) naming the programs; with ``--wait-quiet`` it waits for the machine to go quiet
(up to the seconds given), then goes on, measuring a contended candidate again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from moetune import contention
from moetune.contention import Contention
from moetune.errors import MachineBusy
from moetune.store.db import ResultsDB

WINDOW_S = 2.0  # the foreign load before a launch is averaged over this long
DEFAULT_WAIT_S = 600.0  # --wait-quiet without a value
MAX_REMEASURES = 3  # contended measurements of one search measured again, at most

Status = Callable[[str], None]


def foreign_load(window_s: float = WINDOW_S, sleep: Callable[[float], None] = time.sleep) -> Contention | None:
    """The machine's foreign load over ``window_s`` from now, while no engine runs (moetune's own
    process apart); None when the threshold is off."""
    first = contention.census()
    limit = contention.max_foreign_cores(first.cores)
    if limit is None:
        return None
    sleep(window_s)
    t = contention.Tally()
    t.add(contention.split(first, contention.census(), (), (os.getpid(),)))
    return t.result(limit, engine=False)  # no engine runs: everything but moetune is foreign


def _busy(c: Contention, what: str, waited_s: float | None = None) -> MachineBusy:
    after = "" if waited_s is None else f" (still, after waiting {waited_s:.0f} s)"
    wait = (
        "; or give --wait-quiet [SECONDS] to wait for the machine to go quiet"
        if waited_s is None
        else "; or wait longer (--wait-quiet SECONDS)"
    )
    return MachineBusy(
        f"the machine is too busy to rank candidates{after}: {what}: {c.message()}",
        hint="stop the programs named (or wait for them) and run the same command again: measured "
        f"candidates are kept{wait}; MOETUNE_MAX_FOREIGN_CORES sets the threshold (cores, N% of "
        "the machine, or off)",
    )


class QuietGate:
    """Asked before each launch and after each measurement of a search. ``wait_s`` None: a busy
    machine stops the search; else it is waited for, up to ``wait_s`` seconds each time."""

    def __init__(
        self,
        status: Status,
        wait_s: float | None = None,
        *,
        window_s: float = WINDOW_S,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.status = status
        self.wait_s = wait_s
        self.window_s = window_s
        self.sleep = sleep
        self.remeasured = 0

    def before_launch(self) -> None:
        """Return when the machine is quiet; :class:`MachineBusy` when it is not (and, with a wait,
        did not go quiet in time)."""
        c = foreign_load(self.window_s, self.sleep)
        if c is None or not c.contended:
            return
        if self.wait_s is None:
            raise _busy(c, f"over {self.window_s:g} s before a launch")
        self._wait(c)

    def accept(self, db: ResultsDB, run_id: int | None) -> bool:
        """Whether a measurement can be ranked: False when it was contended and the search waited
        for the machine to go quiet (measure it again); :class:`MachineBusy` without a wait."""
        if run_id is None:
            return True
        c = db.run(run_id).contention
        if c is None or not c.contended:
            return True
        if self.wait_s is None or self.remeasured >= MAX_REMEASURES:
            raise _busy(c, f"run {run_id} was contended while it measured")
        self.remeasured += 1
        self.status(f"run {run_id} was contended ({c.message()}); it is measured again once the machine is quiet")
        self.before_launch()
        return False

    def _wait(self, c: Contention) -> None:
        assert self.wait_s is not None
        start = time.monotonic()
        while True:
            waited = time.monotonic() - start
            top = c.top[0].describe(c.cores) if c.top else "unnamed processes"
            self.status(
                f"waiting for the machine to go quiet ({waited:.0f}/{self.wait_s:.0f} s): foreign load "
                f"{c.foreign_cores:.2f} cores > {c.max_foreign_cores:g}, mostly {top}"
            )
            if waited >= self.wait_s:
                raise _busy(c, f"over {self.window_s:g} s", waited)
            got = foreign_load(self.window_s, self.sleep)
            if got is None or not got.contended:
                self.status(
                    f"the machine is quiet (foreign load {0.0 if got is None else got.foreign_cores:.2f} "
                    f"cores) after {time.monotonic() - start:.0f} s; going on"
                )
                return
            c = got
