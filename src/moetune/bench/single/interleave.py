"""An interleaved sweep: plans measured in rounds, A B, B A, A B …, so that the machine's drift
(heat, clocks, other programs, the page cache) falls on both alike and cancels in the paired
comparison (:mod:`moetune.report.paired`).

Two ways to alternate:

- ``launches``: every round launches each plan, benches it (warm-up and repeats) and stops it, as a
  plain sweep does once. Rounds are independent: each pair of runs has its own launches, so the
  interval between rounds also covers what differs from one launch to the next (where the
  allocator put the buffers, what the page cache held). It costs a launch per plan per round.
- ``batches``: each plan is launched once and both servers stay up; rounds alternate batches of
  requests between them. One launch per plan, so many short rounds are cheap; but both plans must
  fit in memory together (their ledgers are summed per device, ports must differ), and each plan
  is measured beside the other's idle server rather than alone.

A round is the unit of resumption (:mod:`moetune.bench.analysis.rounds`): rounds complete in one
attempt are skipped when the same command runs again, an incomplete one is run again whole, and
asking for more rounds extends the sweep. The first failure stops the sweep: the rounds done are
kept and compared, and running the same command again resumes.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

from moetune.bench.analysis.rounds import (
    BATCHES,
    DETAILS_KEY,
    LAUNCHES,
    MODES,
    RoundTag,
    complete_rounds,
    round_order,
    tagged_runs,
)
from moetune.bench.single.runner import BenchOptions, Launch, Progress, bench, bench_target
from moetune.bench.single.sweep import (
    FAILED,
    MEASURED,
    RESUMED,
    SweepEntry,
    SweepSpec,
    check_transports,
    plan_record,
    sweep_id,
)
from moetune.bench.single.workloads import Workload
from moetune.errors import InputError, MoetuneError
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB

if TYPE_CHECKING:
    from moetune.bench.servers import Launched

Status = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundOutcome:
    round: int
    label: str
    run: int | None
    status: str  # measured | resumed | failed
    error: str | None = None
    launch_s: float | None = None  # launches mode: seconds from the launch's start to the server ready

    def to_json(self) -> dict[str, object]:
        return {
            "round": self.round,
            "label": self.label,
            "run": self.run,
            "status": self.status,
            "error": self.error,
            "launch_s": self.launch_s,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class InterleaveResult:
    sweep: str
    mode: str
    rounds: int  # asked for
    outcomes: list[RoundOutcome]
    launches: int  # made by this invocation
    launch_s: float  # every launch together, to its server's first answer
    wall_s: float

    @property
    def failed(self) -> list[RoundOutcome]:
        return [o for o in self.outcomes if o.status == FAILED]


def together_problems(entries: Sequence[SweepEntry]) -> tuple[list[str], list[str]]:
    """Why the plans cannot all be up at once (``batches``), and what could not be checked. The
    check is the plans' own: every process listens on a distinct address, and per device the
    ledgers' memory summed (the head-room margin once) stays within the device's capacity.
    Conservative: two servers mapping the same model file share its page cache, counted twice."""
    problems: list[str] = []
    unchecked: list[str] = []
    seen: dict[tuple[str, str, int], str] = {}
    for e in entries:
        assert e.target.spec is not None
        for p in e.target.spec.processes:
            key = (p.node, p.host, p.port)
            if key in seen and seen[key] != e.label:
                problems.append(f"{seen[key]} and {e.label} both listen on {p.host}:{p.port}")
            seen.setdefault(key, e.label)
    used: dict[str, list[tuple[str, float]]] = {}
    margin: dict[str, float] = {}
    capacity: dict[str, float] = {}
    for e in entries:
        devices = (e.target.doc or {}).get("devices")
        if not isinstance(devices, list) or not devices:
            unchecked.append(e.label)
            continue
        for d in devices:
            name = str(d.get("name"))
            m = sum(float(it.get("mib") or 0.0) for it in d.get("items") or () if it.get("what") == "margin")
            used.setdefault(name, []).append((e.label, float(d.get("used_mib") or 0.0) - m))
            margin[name] = max(margin.get(name, 0.0), m)
            cap = float(d.get("capacity_mib") or 0.0)
            capacity[name] = min(capacity.get(name, cap), cap)
    for name, parts in used.items():
        total = sum(mib for _, mib in parts) + margin[name]
        if len(parts) > 1 and total > capacity[name]:
            problems.append(
                f"{name}: {' + '.join(f'{mib:,.0f} MiB ({lab})' for lab, mib in parts)}"
                + (f" + {margin[name]:,.0f} MiB margin" if margin[name] else "")
                + f" = {total:,.0f} MiB, more than its {capacity[name]:,.0f} MiB"
            )
    return problems, unchecked


def run_interleaved(
    db: ResultsDB,
    spec: SweepSpec,
    workloads: list[Workload],
    options: BenchOptions,
    *,
    mode: str = LAUNCHES,
    rounds: int = 4,
    sid: str | None = None,
    launch_timeout_s: float = 600.0,
    status: Status | None = None,
    progress_for: Callable[[str], Progress | None] | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> InterleaveResult:
    """Run every round not yet complete, in alternating order; stop at the first failure."""
    if mode not in MODES:
        raise InputError(f"--interleave {mode}: choose {' or '.join(MODES)}")
    if len(spec.entries) < 2:
        raise InputError(
            "an interleaved sweep alternates two or more plans; got one",
            hint="moetune sweep A.json B.json --interleave",
        )
    if rounds < 1:
        raise InputError("--rounds must be at least 1")
    say: Status = status or (lambda _s: None)
    check_transports(spec)
    sid = sid or sweep_id(spec, workloads, options, interleave=mode)

    def record(n: int) -> dict[str, object]:
        return {
            "name": spec.name,
            "baseline": spec.baseline,
            "plans": plan_record(spec),
            "workloads": [w.to_json() for w in workloads],
            "options": asdict(options),
            "interleave": {"mode": mode, "rounds": n},
        }

    if not db.create_sweep(sid, record(rounds)):
        old = (db.sweep(sid) or {}).get("interleave") or {}
        if old.get("mode") != mode:
            raise InputError(
                f"sweep {sid} is not an interleaved sweep by {mode}"
                + (f" (it interleaves by {old['mode']})" if old.get("mode") else ""),
                hint="drop --sweep-id, or give the sweep's own mode",
            )
        db.update_sweep(sid, record(max(rounds, int(old.get("rounds") or 0))))
    labels = [e.label for e in spec.entries]
    done = complete_rounds(tagged_runs(db.runs(sweep_id=sid)), labels)
    todo = [r for r in range(1, rounds + 1) if r not in done]
    outcomes = [
        RoundOutcome(round=r, label=lab, run=done[r][lab], status=RESUMED)
        for r in sorted(done)
        if r <= rounds
        for lab in labels
    ]
    for r in sorted(done):
        if r <= rounds:
            say(f"round {r}: complete in runs {', '.join(str(done[r][lab]) for lab in labels)}, skipped")
    t0 = time.monotonic()
    launch_s, launches = 0.0, 0
    if todo:
        entries = {e.label: e for e in spec.entries}
        with _servers(spec, mode, launch_timeout_s, say) as up:
            launch_s, launches = up.launch_s, len(up.servers)
            for r in todo:
                attempt = secrets.token_hex(4)
                failed = False
                for pos, lab in enumerate(round_order(labels, r)):
                    say(f"round {r}/{rounds}: {lab}")
                    tag = RoundTag(sweep=sid, round=r, attempt=attempt, mode=mode, position=pos)
                    o = _measure(
                        db,
                        entries[lab],
                        up,
                        workloads=workloads,
                        options=options,
                        tag=tag,
                        launch_timeout_s=launch_timeout_s,
                        status=say,
                        progress_for=progress_for,
                        on_snapshot=on_snapshot,
                    )
                    outcomes.append(o)
                    if o.launch_s is not None:
                        launch_s, launches = launch_s + o.launch_s, launches + 1
                    if o.status == FAILED:
                        say(f"{lab}: failed in round {r}: {o.error}")
                        failed = True
                        break
                if failed:
                    break
    return InterleaveResult(
        sweep=sid,
        mode=mode,
        rounds=rounds,
        outcomes=outcomes,
        launches=launches,
        launch_s=launch_s,
        wall_s=time.monotonic() - t0,
    )


class _Up:
    """The servers a batches sweep keeps up for all its rounds (none in launches mode)."""

    def __init__(self) -> None:
        self.servers: dict[str, Launched] = {}  # by label
        self.launch_s = 0.0


@contextmanager
def _servers(spec: SweepSpec, mode: str, timeout_s: float, status: Status) -> Iterator[_Up]:
    up = _Up()
    if mode != BATCHES:
        yield up
        return
    problems, unchecked = together_problems(spec.entries)
    if problems:
        raise InputError(
            "--interleave batches keeps every plan up at once, and these plans cannot be: " + "; ".join(problems),
            hint="use --interleave launches (a launch per plan per round), or plan them to share "
            "the machine (other ports, less memory each)",
        )
    if unchecked:
        status(f"{', '.join(unchecked)}: no memory ledger in the plan, so fitting together was not checked")
    from moetune.bench.servers import launched, new_launch_id

    with ExitStack() as stack:
        t = time.monotonic()
        for e in spec.entries:
            status(f"launching {e.label} for every round")
            up.servers[e.label] = stack.enter_context(
                launched(e.target, timeout_s=timeout_s, status=status, launch_id=new_launch_id())
            )
        up.launch_s = time.monotonic() - t
        yield up


def _measure(
    db: ResultsDB,
    e: SweepEntry,
    up: _Up,
    *,
    workloads: list[Workload],
    options: BenchOptions,
    tag: RoundTag,
    launch_timeout_s: float,
    status: Status,
    progress_for: Callable[[str], Progress | None] | None,
    on_snapshot: Callable[[Snapshot], None] | None,
) -> RoundOutcome:
    """One plan's run in one round: launched for it, or on its server that stays up."""
    details = {DETAILS_KEY: tag.to_json()}
    name = f"{e.label} · round {tag.round}"
    progress = progress_for(name) if progress_for else None
    try:
        srv = up.servers.get(e.label)
        if srv is None:
            t = time.monotonic()
            ready: list[float] = []
            run_id = bench_target(
                db,
                e.target,
                workloads,
                options,
                label=e.label,
                sweep_id=tag.sweep,
                launch_timeout_s=launch_timeout_s,
                status=status,
                progress_for=(lambda _lab: progress) if progress_for else None,
                on_start=lambda _r: ready.append(time.monotonic() - t),
                on_snapshot=on_snapshot,
                details=details,
            )
            return RoundOutcome(
                round=tag.round, label=e.label, run=run_id, status=MEASURED, launch_s=ready[0] if ready else None
            )
        assert e.target.doc is not None
        facts = replace(srv.facts, load_s=None)  # one launch for every round: its load time is no round's
        run_id = bench(
            db,
            srv.url,
            workloads,
            options,
            label=e.label,
            target=e.target.name,
            sweep_id=tag.sweep,
            launch=Launch(
                plan=e.target.doc,
                engine_build=srv.engine_build,
                model_path=srv.model_path,
                launch_run=srv.launch_run,
                service=e.target.server,
                facts=facts,
            ),
            progress=progress,
            on_snapshot=on_snapshot,
            details=details,
        )
        return RoundOutcome(round=tag.round, label=e.label, run=run_id, status=MEASURED)
    except MoetuneError as err:
        return RoundOutcome(round=tag.round, label=e.label, run=None, status=FAILED, error=str(err))
