"""The user's workload as a figure: a replay's total time per pass, an agent turn's time per
session (pure: raw serve-bench samples in, seconds out).

- A replay pass (``serve-bench --replay`` measured several times, `tune --objective replay:FILE`):
  its samples carry ``replay: {sha256, repeat, request}``; the pass's total time is its span, from
  its first request due to its last one ended (:func:`moetune.bench.analysis.serve.level_span`). A
  pass with a failed request has no total (it did less than the session), unless the recording
  failed that request too (``excused``: its positions in the session).
- An agent turn (`tune --objective turn`, serve-bench's sessions run one after another): each
  session's turn time is the mean end-to-end time of its turns, from a turn's request sent to its
  reply's last token, prompt processing included as the server's prefix cache really served it
  (the cached tokens the server reported are beside it, :func:`cache_of`). A session with a failed
  turn has no turn time.

Both are lower-is-better seconds; `compare` gets them as ``replay_s:SHA`` (a file's passes compare
with another run's passes of the same file only) and ``turn_s``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from moetune.bench.analysis.serve import RequestMetrics, Sample, level_span, request_metrics
from moetune.bench.analysis.sessions import ServeRunSeries, prompt_cache, session_turn
from moetune.bench.analysis.stats import MetricSamples
from moetune.jsonread import mapping

REPLAY_METRIC = "replay_s"
TURN_METRIC = "turn_s"


@dataclass(frozen=True, slots=True)
class Totals:
    """Each measured pass's (or session's) seconds, and how many had a failed request (no total)."""

    seconds: tuple[float, ...] = ()
    failed: int = 0


@dataclass(frozen=True, slots=True)
class Cache:
    """Prompt tokens the server evaluated and those it reused from its prefix cache, as reported."""

    processed: int | None
    reused: int | None

    @property
    def reused_share(self) -> float | None:
        if self.processed is None or self.reused is None or self.processed + self.reused == 0:
            return None
        return self.reused / (self.processed + self.reused)


def replay_key(s: Sample) -> tuple[str, int] | None:
    r = s.get("replay")
    if (
        not isinstance(r, Mapping)
        or not isinstance(sha := r.get("sha256"), str)
        or not isinstance(n := r.get("repeat"), int)
    ):
        return None
    return sha, n


def replay_totals(samples: Iterable[Sample], excused: Collection[int] = ()) -> dict[str, Totals]:
    """Per replayed file (its sha256's first 16 digits), each measured pass's total time (s), in
    pass order; a request at a position in ``excused`` may fail without failing its pass."""
    passes: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        if (key := replay_key(s)) is not None and key[1] >= 0:
            passes.setdefault(key, []).append(s)
    out: dict[str, tuple[list[float], int]] = {}
    for (sha, _), ss in sorted(passes.items()):
        seconds, failed = out.setdefault(sha, ([], 0))
        span = level_span(ss)
        if span is None or any(s.get("error") and mapping(s.get("replay")).get("request") not in excused for s in ss):
            out[sha] = (seconds, failed + 1)
        else:
            seconds.append(span)
    return {sha: Totals(tuple(v), f) for sha, (v, f) in out.items()}


def turn_times(samples: Iterable[Sample]) -> Totals:
    """Each session's mean turn time (s), in session order."""
    by: dict[int, list[Sample]] = {}
    for s in samples:
        if (st := session_turn(s)) is not None:
            by.setdefault(st[0], []).append(s)
    seconds, failed = [], 0
    for _, ss in sorted(by.items()):
        ms = [request_metrics(s) for s in ss]
        e2e = [m.e2e_s for m in ms if m.ok and m.e2e_s is not None]
        if len(e2e) < len(ms) or not e2e:
            failed += 1
        else:
            seconds.append(sum(e2e) / len(e2e))
    return Totals(tuple(seconds), failed)


def cache_of(samples: Iterable[Sample]) -> Cache:
    """The prompt tokens processed and reused over every successful request, as the server reported
    them (None where it reported neither: :func:`moetune.bench.analysis.sessions.prompt_cache`)."""
    processed: int | None = 0
    reused: int | None = 0
    for s in samples:
        if s.get("error"):
            continue
        c = prompt_cache(s)
        processed = None if processed is None or c.processed is None else processed + c.processed
        reused = None if reused is None or c.reused is None else reused + c.reused
    return Cache(processed, reused)


def objective_metrics(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """``replay_s:SHA`` per replayed file (s per pass) and ``turn_s`` (s per session), for `compare`."""
    held = list(samples)
    out = {
        f"{REPLAY_METRIC}:{sha}": MetricSamples(
            values=t.seconds, higher_is_better=False, unit="s", family="replay total"
        )
        for sha, t in replay_totals(held).items()
        if t.seconds
    }
    turns = turn_times(held)
    if turns.seconds and len(turns.seconds) > 1:
        out[TURN_METRIC] = MetricSamples(values=turns.seconds, higher_is_better=False, unit="s", family="turn time")
    return out


class WorkloadRunSeries(ServeRunSeries):
    """A serve-bench run's metrics (:class:`~moetune.bench.analysis.sessions.ServeRunSeries`) and its
    workload figures: a replay's pass totals and a sessions run's turn times, taken a sample at a time
    (of a replay's requests only their pass and times are held)."""

    def __init__(self) -> None:
        super().__init__()
        self.passes: list[dict[str, object]] = []

    def add(self, s: Sample, m: RequestMetrics | None = None) -> None:
        super().add(s, m)
        if "replay" in s:
            self.passes.append({k: s.get(k) for k in ("replay", "t_sched", "t_end", "error")})

    def metrics(self) -> dict[str, MetricSamples]:
        return {**super().metrics(), **objective_metrics([*self.turns, *self.passes])}


def serve_bench_metrics(samples: Iterable[Sample]) -> dict[str, MetricSamples]:
    """A serve-bench run's metrics for `moetune compare`, its workload figures included, the samples read once."""
    series = WorkloadRunSeries()
    for s in samples:
        series.add(s)
    return series.metrics()
