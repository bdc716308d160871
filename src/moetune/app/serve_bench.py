"""`moetune serve-bench TARGET`: a server under concurrent streaming load (levels of concurrency or
a rate), agent sessions (``--sessions``), a recorded session replayed (``--replay``), or every
service of a layout plan driven at once (``--load``); one stored run each.

The request holds the options as the command line gave them (``given``: the names of those given
on it rather than left at their defaults); which of the four runs is made, and which options do
not go together, is decided here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moetune.app.progress import Callbacks
from moetune.errors import InputError

if TYPE_CHECKING:
    from moetune.bench.serve.sessions import SessionSpec
    from moetune.bench.servers import ServerSource
    from moetune.monitor.snapshot import Snapshot
    from moetune.store.db import ResultsDB

# options that shape load levels, which a sessions run does not have
LEVEL_OPTIONS = ("concurrency", "rate", "dataset", "input_len", "requests", "duration", "prefix_cache")
SESSION_OPTIONS = ("turns", "system_tokens", "turn_tokens", "think_time", "strip_thinking")

# serve-bench's options that are every --load's defaults, by their SPEC key
LOAD_DEFAULTS = {
    "concurrency": "concurrency",
    "rate": "rate",
    "arrivals": "arrivals",
    "dataset": "dataset",
    "input_len": "input-len",
    "output_len": "output-len",
    "tokenizer": "tokenizer",
    "requests": "requests",
    "duration": "duration",
    "warmup": "warmup",
    "seed": "seed",
    "prefix_cache": "prefix-cache",
    "thinking": "thinking",
    "timeout_s": "timeout",
    "model": "model",
    "replay": "replay",
    "speed": "speed",
    "sessions": "sessions",
    "turns": "turns",
    "system_tokens": "system-tokens",
    "turn_tokens": "turn-tokens",
    "think_time": "think-time",
    "strip_thinking": "strip-thinking",
}

# options that make prompts or shape the load; a replay sends the recorded requests as they came
NOT_WITH_REPLAY = (
    "rate",
    "arrivals",
    "dataset",
    "input_len",
    "output_len",
    "requests",
    "duration",
    "warmup",
    "seed",
    "prefix_cache",
    "thinking",
    "match_slots",
    "tokenizer",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeBenchRequest:
    """serve-bench's options; the field names are the options' (``given`` names them)."""

    target: str  # a server's URL, or a plan file (a layout plan with ``loads``)
    concurrency: str = "1"  # the levels: a comma list
    rate: float | None = None
    arrivals: str = "poisson"
    dataset: Path | None = None
    input_len: int | None = None
    output_len: int | None = None
    tokenizer: Path | None = None
    requests: int | None = None
    duration: float | None = None  # seconds per level
    warmup: int = 0
    seed: int = 0
    prefix_cache: bool = False
    thinking: str = "template"  # on | off | template (the server's default)
    timeout_s: float = 600.0
    model: str | None = None
    label: str | None = None
    match_slots: bool = False
    server: str | None = None
    plot_dir: Path | None = None
    slo: str | None = None  # KEY=MS,...
    replay: Path | None = None
    speed: str = "1x"
    loads: tuple[str, ...] = ()  # SERVICE=SPEC
    rounds: int = 1
    transport: str | None = None
    rdma_dev: str | None = None
    db_path: Path | None = None
    sessions: int | None = None
    turns: int | None = None
    system_tokens: int | None = None
    turn_tokens: int | None = None
    think_time: float | None = None
    strip_thinking: bool = False
    given: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeBenched:
    """The run's report (bench.serve's document, as --json prints it), whether it is a layout's,
    and the plots written (``--plot``)."""

    doc: dict[str, Any]
    layout: bool = False
    plots: tuple[Path, ...] = ()

    @property
    def run_id(self) -> int:
        return int(self.doc["run"]["id"])


def levels(text: str) -> tuple[int, ...]:
    """--concurrency's levels."""
    try:
        cs = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        cs = ()
    if not cs or min(cs) < 1:
        raise InputError(f"--concurrency {text!r}: give positive integers separated by commas, e.g. 1,2,4")
    return cs


def slo_targets(text: str | None) -> dict[str, float] | None:
    from moetune.bench.analysis.slo import parse_slo

    return None if text is None else parse_slo(text)


def serve_bench(req: ServeBenchRequest, cb: Callbacks | None = None) -> ServeBenched:
    """Make the run the options ask for and store it."""
    cb = cb or Callbacks()
    log = cb.status or _quiet
    slo = slo_targets(req.slo)
    if req.loads or "rounds" in req.given:
        return _layout(req, slo, log, cb.on_snapshot)
    lv = levels(req.concurrency)
    if req.replay is not None or "speed" in req.given:
        return _replay(req, slo, lv, log=log, snap=cb.on_snapshot)
    return _levels_or_sessions(req, slo, lv, log=log, snap=cb.on_snapshot)


def stored(
    run_ref: str, *, slo_text: str | None = None, plot_dir: Path | None = None, db_path: Path | None = None
) -> ServeBenched:
    """`moetune serve-report`: a stored run's report derived again from its samples (goodput by
    ``slo_text``'s targets, else the run's own), its levels drawn into ``plot_dir``."""
    from moetune.bench.serve.layout_run import is_layout_run, stored_layout_report
    from moetune.bench.serve.run import stored_report
    from moetune.store.db import ResultsDB

    slo = slo_targets(slo_text)
    with ResultsDB.open(db_path) as db:
        run = db.resolve(run_ref)
        if is_layout_run(run):
            return ServeBenched(doc=stored_layout_report(db, run, slo), layout=True)
        doc = stored_report(db, run, slo)
    return ServeBenched(doc=doc, plots=_plots(doc, plot_dir))


def _plots(doc: dict[str, Any], plot_dir: Path | None) -> tuple[Path, ...]:
    run = doc["run"]
    if plot_dir is None or not doc["levels"]:
        return ()
    from moetune.report.plot import plot_sweep

    paths = plot_sweep(doc["levels"], plot_dir, title=f"run {run['id']}: {run['label']}")
    run["plots"] = [str(p) for p in paths]
    return tuple(paths)


def _quiet(_: str) -> None:
    pass


Snap = Callable[["Snapshot"], None] | None


def _open(db_path: Path | None) -> ResultsDB:
    from moetune.store.db import ResultsDB

    return ResultsDB.open(db_path)


def _levels_or_sessions(
    req: ServeBenchRequest, slo: dict[str, float] | None, lv: tuple[int, ...], *, log: Callable[[str], None], snap: Snap
) -> ServeBenched:
    from moetune.bench.serve.run import ServeBenchSpec, server_source
    from moetune.bench.serve.run import serve_bench as run_levels

    if req.dataset is not None and req.input_len is not None:
        raise InputError("--input-len sets synthetic prompts; a --dataset brings its own", hint="drop one of them")
    if req.requests is not None and req.duration is not None:
        raise InputError("give --requests or --duration, not both")
    spec = ServeBenchSpec(
        url=req.target,
        concurrency=lv,
        rate=req.rate,
        arrivals=req.arrivals,
        dataset=req.dataset,
        input_len=req.input_len or 128,
        output_len=req.output_len,
        requests=req.requests,
        duration_s=req.duration,
        warmup=req.warmup,
        seed=req.seed,
        prefix_cache=req.prefix_cache,
        thinking={"on": True, "off": False}.get(req.thinking),
        timeout_s=req.timeout_s,
        model=req.model,
        label=req.label,
        slo=slo,
        sessions=session_spec(req),
        tokenizer=req.tokenizer,
    )
    source = server_source(
        spec,
        req.target,
        match_slots=req.match_slots,
        server=req.server,
        status=log,
        transport=req.transport,
        rdma_dev=req.rdma_dev,
    )
    with _open(req.db_path) as db:
        if spec.sessions is not None:
            from moetune.bench.serve.session_run import serve_sessions

            doc = serve_sessions(spec, db, log=log, source=source, on_snapshot=snap)
        else:
            doc = run_levels(spec, db, log=log, source=source, on_snapshot=snap)
    return ServeBenched(doc=doc, plots=_plots(doc, req.plot_dir))


def session_spec(req: ServeBenchRequest) -> SessionSpec | None:
    """The sessions workload, or None without --sessions; combinations that make no sense are input
    errors (exit 2)."""
    given = [o for o in SESSION_OPTIONS if getattr(req, o) not in (None, False)]
    if req.sessions is None:
        if given:
            raise InputError(f"{', '.join(_flag(o) for o in given)} shape agent sessions", hint="add --sessions N")
        return None
    levels_given = [o for o in LEVEL_OPTIONS if o in req.given]
    if levels_given:
        raise InputError(
            f"--sessions runs conversations, not load levels: {', '.join(_flag(o) for o in levels_given)} do not apply",
            hint="the sessions are the concurrency (--sessions N); the sizes are "
            "--system-tokens, --turn-tokens and --output-len; the prefix cache is always on",
        )
    if req.strip_thinking and req.thinking == "off":
        raise InputError(
            "--strip-thinking removes the reasoning from the history, and with --thinking off the replies have none",
            hint="use --thinking on (or the server's default) with --strip-thinking",
        )
    from moetune.bench.serve.sessions import SessionSpec

    return SessionSpec(
        sessions=req.sessions,
        turns=req.turns or 4,
        system_tokens=req.system_tokens or 512,
        turn_tokens=req.turn_tokens or 128,
        output_len=req.output_len or 64,
        think_time_s=req.think_time or 0.0,
        strip_thinking=req.strip_thinking,
    )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _replay(
    req: ServeBenchRequest, slo: dict[str, float] | None, lv: tuple[int, ...], *, log: Callable[[str], None], snap: Snap
) -> ServeBenched:
    from moetune.bench.record.replay import ReplaySpec, replay_bench
    from moetune.bench.serve.run import ServeBenchSpec, server_source

    if req.sessions is not None or any(getattr(req, o) not in (None, False) for o in SESSION_OPTIONS):
        raise InputError(
            "--replay sends the recorded requests; --sessions makes its own conversations", hint="drop one of them"
        )
    if req.replay is None:
        raise InputError("--speed paces a replay", hint="add --replay FILE, or drop --speed")
    clash = [o for o in NOT_WITH_REPLAY if o in req.given]
    if clash:
        names = ", ".join(_flag(n) for n in clash)
        raise InputError(
            f"--replay sends the recorded requests as they are: drop {names}",
            hint="--speed paces the replay, --concurrency bounds the requests in flight",
        )
    if len(lv) > 1:
        raise InputError("--replay runs one level: give one --concurrency value")
    spec = ReplaySpec(
        file=req.replay,
        speed=req.speed,
        concurrency=lv[0] if "concurrency" in req.given else None,
        model=req.model,
        timeout_s=req.timeout_s,
        label=req.label,
        slo=slo,
    )
    source: ServerSource = server_source(
        ServeBenchSpec(url=req.target),
        req.target,
        match_slots=False,
        server=req.server,
        status=log,
        transport=req.transport,
        rdma_dev=req.rdma_dev,
    )
    with _open(req.db_path) as db:
        doc = replay_bench(spec, db, source, log=log, on_snapshot=snap)
    return ServeBenched(doc=doc, plots=_plots(doc, req.plot_dir))


def load_defaults(req: ServeBenchRequest) -> dict[str, object]:
    """The options given on the command line, as --load SPEC keys with their values read."""
    from moetune.bench.serve.loadspec import KEYS

    out: dict[str, object] = {}
    for name, key in LOAD_DEFAULTS.items():
        if name not in req.given:
            continue
        v = getattr(req, name)
        if key == "concurrency":
            v = levels(str(v))
            if len(v) > 1:
                raise InputError(
                    f"--concurrency {req.concurrency}: with --load each service runs one level",
                    hint="give one value, or each service its own: --load NAME=concurrency:N",
                )
            v = v[0]
        elif key == "thinking" or isinstance(v, Path):
            v = KEYS[key](str(v))
        out[key] = v
    return out


def _layout(
    req: ServeBenchRequest, slo: dict[str, float] | None, log: Callable[[str], None], snap: Snap
) -> ServeBenched:
    from moetune.bench.serve.layout_run import LayoutSpec, layout_bench
    from moetune.bench.serve.loadspec import parse_loads, with_slo
    from moetune.bench.servers import check_transport
    from moetune.bench.target import layout_target, with_transport

    if not req.loads:
        raise InputError("--rounds counts the rounds of a layout's --load", hint="add --load SERVICE=SPEC")
    for flag, given in (
        ("--match-slots", req.match_slots),
        ("--server", req.server is not None),
        ("--plot", req.plot_dir is not None),
    ):
        if given:
            raise InputError(f"{flag} does not apply with --load", hint=f"drop {flag}: --load names the services")
    parsed = with_slo(parse_loads(req.loads, load_defaults(req)), slo)
    t = with_transport(layout_target(req.target), req.transport, req.rdma_dev)
    check_transport(t)
    spec = LayoutSpec(loads=tuple(parsed), rounds=req.rounds, label=req.label, slo=slo)
    with _open(req.db_path) as db:
        return ServeBenched(doc=layout_bench(t, spec, db, log=log, on_snapshot=snap), layout=True)
