"""`moetune tune --objective replay:FILE` and `--objective turn`: the user's workload as the objective.

- ``replay:FILE``: a session `moetune record` wrote, replayed by serve-bench's replay
  (:mod:`moetune.bench.record.replay`) on each candidate: ``--warmup`` passes, then ``--repeats``
  measured passes over the whole session, one after another in one launch. Each pass puts its own
  salt before every request's first text (:func:`moetune.bench.record.schedule.salted`), so it meets
  the server's prefix cache as the session itself filled it, not as the last pass left it; and
  each request generates exactly the tokens the recording counted (``max_tokens`` and
  ``ignore_eos``), so every candidate does the same work. The value is each pass's total time,
  from its first request due to its last one ended (``--replay-speed``: ``max`` back to back,
  ``1x`` at the recorded pace, ``Nx`` N times faster; serve-bench's ``--speed``).
- ``turn``: an agent's conversation (serve-bench's sessions, :mod:`moetune.bench.serve.session_run`):
  a system prompt of ``--depth`` tokens, then ``--turns`` turns, each a message of ``--pp-tokens``
  and a reply of ``--tg-tokens``, with the whole history sent each time and the prefix cache on.
  ``--repeats`` sessions run one after another, each with its own system prompt (no session
  reuses another's cache); the value is each session's mean turn time (request sent to the
  reply's end: the prompt processing the cache left, plus the reply). The prompt tokens the server
  reports as processed and as reused are stored with every turn and reported: measured, not assumed.

Both are times, lower is better; the search ranks their reciprocals (passes or turns per second,
as ``ttft`` ranks first tokens per second) by the rule of `compare`, and reports the seconds.
"""

from __future__ import annotations

import heapq
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.bench.serve.sessions import SessionSpec
from moetune.errors import InputError

if TYPE_CHECKING:  # the command line reads this module's defaults before anything heavy is needed
    from moetune.bench.analysis.objective import Cache, Totals
    from moetune.monitor.snapshot import Snapshot
    from moetune.plan.settings import Settings
    from moetune.plan.speed import SpeedConstants, Work
    from moetune.store.db import ResultsDB

Status = Callable[[str], None]
SINGLE = ("tg", "pp", "ttft")
NAMES = (*SINGLE, "goodput", "turn", "replay:FILE", "weighted:SERVICE=METRIC:WEIGHT,...")
TEMPLATE_TOKENS = 64  # a slot's room for the chat template's tokens beyond what the texts count
MIN_SYSTEM_TOKENS = 16  # a session's system prompt: its tag and some text


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One recorded request as the prediction sees it."""

    offset_s: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayObjective:
    file: Path
    sha256: str
    speed: str  # serve-bench's --speed: max, 1x, Nx
    concurrency: int  # client slots (the recording's most in flight): the candidate's server slots
    per_slot: int  # tokens a slot needs: the longest recorded prompt and its reply, and the template's
    calls: tuple[Call, ...]
    counted: bool  # the recording counted every request's tokens (else the prediction guesses 0 for them)
    excused: tuple[int, ...] = ()  # the requests (positions) the recording got no whole answer to

    name = "replay"

    def key(self) -> dict[str, object]:
        return {"replay": self.sha256, "speed": self.speed}


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnObjective:
    session: SessionSpec

    name = "turn"

    @property
    def concurrency(self) -> int:
        return 1

    @property
    def per_slot(self) -> int:
        return self.session.context_need() * 5 // 4 + TEMPLATE_TOKENS

    def key(self) -> dict[str, object]:
        return {"turn": self.session.to_json()}


WorkObjective = ReplayObjective | TurnObjective


def parse(text: str) -> tuple[str, Path | None]:
    """``--objective``'s value: its name, and the file of ``replay:FILE`` (``weighted:...``: the
    name only, its terms read by :func:`moetune.tune.weighted.parse`); an InputError that lists
    the objectives for anything else."""
    t = text.strip()
    if t in (*SINGLE, "goodput", "turn"):
        return t, None
    if t.startswith("weighted"):  # its terms: moetune.tune.weighted.parse
        return "weighted", None
    if t.startswith("replay:"):
        path = t.removeprefix("replay:").strip()
        if not path:
            raise InputError(
                "--objective replay: give the session file, e.g. --objective replay:session.jsonl",
                hint="`moetune record` writes one",
            )
        return "replay", Path(path).expanduser()
    if t == "replay":
        raise InputError(
            "--objective replay needs the session file: --objective replay:FILE",
            hint="`moetune record --upstream URL -o FILE` records one",
        )
    raise InputError(
        f"--objective {text!r}: choose one of {', '.join(NAMES)}",
        hint="replay:FILE replays a session `moetune record` wrote; turn times an agent's turn",
    )


def replay_objective(path: Path, speed: str) -> ReplayObjective:
    """The session at ``path``, checked before anything is planned or launched."""
    from moetune.bench.record.replay import load_session
    from moetune.bench.record.schedule import parse_speed, replay_concurrency, replay_requests

    try:
        parse_speed(speed)
    except InputError as e:
        raise InputError(str(e).replace("--speed", "--replay-speed"), hint=e.hint) from None
    if not path.is_file():
        raise InputError(f"--objective replay:{path}: no such file", hint="give a session file `moetune record` wrote")
    try:
        session = load_session(path)
    except InputError as e:
        raise InputError(str(e).replace("--replay ", "--objective replay:", 1), hint=e.hint) from None
    reqs, _ = replay_requests(session.exchanges)
    if not reqs:
        raise InputError(
            f"--objective replay:{path}: it records no chat or completions request to replay",
            hint="record a client's POST /v1/chat/completions or /v1/completions traffic",
        )
    calls = tuple(
        Call(
            offset_s=r.offset_s,
            prompt_tokens=r.recorded_prompt_tokens or 0,
            completion_tokens=r.recorded_completion_tokens or r.max_tokens,
        )
        for r in reqs
    )
    counted = all(
        r.recorded_prompt_tokens is not None and r.recorded_completion_tokens is not None for r in reqs if r.recorded_ok
    )  # one the recording failed has no counts to give
    longest = max((c.prompt_tokens + c.completion_tokens for c in calls), default=0)
    return ReplayObjective(
        file=path.resolve(),
        sha256=session.sha256,
        speed=speed.strip().lower(),
        concurrency=replay_concurrency(session.exchanges),
        per_slot=longest + TEMPLATE_TOKENS if counted else 0,
        calls=calls,
        counted=counted,
        excused=tuple(i for i, r in enumerate(reqs) if not r.recorded_ok),
    )


def turn_objective(*, system_tokens: int, turns: int, turn_tokens: int, output_len: int, repeats: int) -> TurnObjective:
    return TurnObjective(
        session=SessionSpec(
            sessions=repeats,
            turns=turns,
            system_tokens=system_tokens,
            turn_tokens=turn_tokens,
            output_len=output_len,
            sequential=True,
        )
    )


def slotted(s: Settings, w: WorkObjective) -> Settings:
    """The settings with one slot per request the workload has in flight, each slot holding the
    longest request (a slot's share of the user's --ctx kept where it is larger)."""
    per_slot = max(w.per_slot, s.ctx // max(1, s.slots))
    return replace(s, slots=w.concurrency, ctx=per_slot * w.concurrency)


# ---- what the speed model expects (the search's prior) ------------------------------------------


def _request_s(work: Work, k: SpeedConstants, *, prompt: int, context: int, reply: int) -> float:
    from moetune.plan.speed import decode_context, decode_seconds, prefill_tok_s

    pp = prefill_tok_s(work, k, max(1, prompt), max(0, context - prompt)) if prompt else 0.0
    return (prompt / pp if pp > 0 else 0.0) + reply * decode_seconds(work, decode_context(context, 0, reply), k)


def predicted_seconds(w: WorkObjective, work: Work, k: SpeedConstants) -> float:
    """A pass's total time (replay) or a turn's mean time, as the speed model expects it: a replay's
    requests whole prompts each (the model knows no cache), started at their due times on the
    slots free then; a turn's prompt the new message and the last reply (the history before it
    cached; a reply sent back as text often tokenizes otherwise than it was generated), but the
    first, which evaluates the system prompt too."""
    if isinstance(w, TurnObjective):
        ss = w.session
        total, ctx = 0.0, ss.system_tokens
        for t in range(ss.turns):
            prompt = ss.turn_tokens + (ss.system_tokens if t == 0 else ss.output_len)
            ctx += ss.turn_tokens
            total += _request_s(work, k, prompt=prompt, context=ctx, reply=ss.output_len)
            ctx += ss.output_len
        return total / ss.turns
    from moetune.bench.record.schedule import parse_speed

    speed = parse_speed(w.speed)
    return finish_s(
        [c.offset_s / speed if speed else 0.0 for c in w.calls],
        [
            _request_s(work, k, prompt=c.prompt_tokens, context=c.prompt_tokens, reply=c.completion_tokens)
            for c in w.calls
        ],
        w.concurrency,
    )


def finish_s(due_s: Sequence[float], took_s: Sequence[float], slots: int) -> float:
    """When the last of the requests ends, each started in order at its due time or when one of
    ``slots`` client slots frees, whichever is later, and taking its time."""
    free = [0.0] * max(1, slots)
    end = 0.0
    for due, took in zip(due_s, took_s, strict=True):
        done = max(due, heapq.heappop(free)) + took
        heapq.heappush(free, done)
        end = max(end, done)
    return end


# ---- what a candidate measured -------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """A candidate's measurement of the workload: seconds per pass (or per session's turn), failed
    ones counted, and the prompt tokens the server processed and reused over them."""

    totals: Totals
    cache: Cache
    requests: int
    ok: int
    errors: tuple[tuple[str, int], ...] = ()  # the failed requests' errors and how many of each

    def problem(self) -> str | None:
        """Why there is nothing to rank (every pass, or session, had a failed request); None when there is."""
        if self.seconds:
            return None
        errs = ", ".join(f"{e} x{n}" for e, n in self.errors) or "none recorded"
        return (
            f"no pass of the workload ended without a failed request ({self.requests - self.ok} of "
            f"{self.requests} requests failed: {errs}); `moetune serve-report RUN` shows them"
        )

    @property
    def seconds(self) -> tuple[float, ...]:
        return self.totals.seconds

    @property
    def values(self) -> list[float]:
        """What the search ranks: passes (turns) per second, higher is better."""
        return [1.0 / s for s in self.seconds if s > 0]

    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


def measured(samples: Sequence[dict[str, object]], w: WorkObjective) -> Measured:
    """One launch's measurement of the workload."""
    return pooled([samples], w)


def pooled(launches: Sequence[Sequence[dict[str, object]]], w: WorkObjective) -> Measured:
    """Every launch's measurement of the workload, pooled (tune --confirm): each launch's passes,
    or sessions, read from its own samples (their indices start again at each launch)."""
    from moetune.bench.analysis.objective import Totals, cache_of, replay_totals, turn_times

    each = [
        replay_totals(ss, w.excused).get(w.sha256[:16], Totals()) if isinstance(w, ReplayObjective) else turn_times(ss)
        for ss in launches
    ]
    samples = [x for ss in launches for x in ss]
    errors = Counter(str(s["error"]) for s in samples if s.get("error"))
    return Measured(
        totals=Totals(tuple(x for t in each for x in t.seconds), sum(t.failed for t in each)),
        cache=cache_of(samples),
        requests=len(samples),
        ok=sum(1 for s in samples if not s.get("error")),
        errors=tuple(sorted(errors.items())),
    )


def run_candidate(
    db: ResultsDB,
    path: Path,
    w: WorkObjective,
    *,
    label: str,
    sweep_id: str,
    repeats: int,
    warmup: int,
    launch_timeout_s: float,
    request_timeout_s: float,
    status: Status,
    on_snapshot: Callable[[Snapshot], None] | None = None,
    transport: str = "tcp",
    rdma_dev: str | None = None,
    server: str | None = None,
) -> int:
    """Launch the plan at ``path`` as it is (its slots planned for the workload), measure the
    workload on its server (``server``: the one of a layout's), store the run under the tune's id;
    its run id."""
    from moetune.bench.servers import PlanServers
    from moetune.bench.target import plan_target, with_transport

    source = PlanServers(
        with_transport(plan_target(path, server), transport, rdma_dev),
        match=False,
        need_per_slot=w.per_slot,
        status=status,
        timeout_s=launch_timeout_s,
    )
    if isinstance(w, ReplayObjective):
        from moetune.bench.record.replay import ReplaySpec, replay_bench

        spec = ReplaySpec(
            file=w.file,
            speed=w.speed,
            concurrency=w.concurrency,
            timeout_s=request_timeout_s,
            label=label,
            repeats=repeats,
            warmup=warmup,
            pin_tokens=True,
            sweep_id=sweep_id,
            objective=w.name,
        )
        doc = replay_bench(spec, db, source, log=status, on_snapshot=on_snapshot)
    else:
        import functools

        from moetune.bench.serve.run import ServeBenchSpec, serve_bench
        from moetune.bench.serve.session_run import bench_sessions

        ss = w.session
        sspec = ServeBenchSpec(
            url=str(path),
            concurrency=(1,),
            output_len=ss.output_len,
            warmup=warmup,
            timeout_s=request_timeout_s,
            label=label,
            sessions=ss,
        )
        run = functools.partial(
            bench_sessions, sweep_id=sweep_id, details={"objective": {"name": w.name, "session": ss.to_json()}}
        )
        doc = serve_bench(sspec, db, log=status, source=source, on_snapshot=on_snapshot, workload=run)
    return int(doc["run"]["id"])


def describe(w: WorkObjective) -> str:
    """What the objective measured, in words."""
    if isinstance(w, ReplayObjective):
        pace = {"max": "back to back", "1x": "at the recorded pace"}.get(w.speed, f"at {w.speed} the recorded pace")
        return (
            f"replay of {w.file.name} (sha256 {w.sha256[:12]}, {len(w.calls)} requests, up to {w.concurrency} "
            f"in flight) {pace}: total time per pass"
        )
    ss = w.session
    return (
        f"agent turn: system prompt {ss.system_tokens} tokens, {ss.turns} turns of {ss.turn_tokens} tokens in, "
        f"{ss.output_len} out, prefix cache on: mean turn time per session"
    )
