"""The load generator: closed-loop concurrency or open-loop arrivals, bounded by client slots.

- Closed loop (no rate): ``concurrency`` workers each send the next request as soon as their
  previous one ends, like ``vllm bench serve --max-concurrency C`` with an infinite rate.
- Open loop (``rate`` requests/s, Poisson or constant arrivals): each request is due at its own
  arrival time, computed in advance, and waits for one of ``concurrency`` client slots. The due
  time is recorded, not the time the client got round to it, so queueing in the client shows up
  in the queue-inclusive latency instead of vanishing (coordinated omission). A replay gives the
  due times itself (``LoadSpec.offsets``) and its requests as they are (:class:`Prepared`).

Every finished request goes to ``on_sample`` at once (the caller stores it), errors included.
A server that is evidently gone (as many requests in a row as there are streams, and at least
``GONE_AFTER``, failed without an answer: refused, reset, disconnected, timed out) stops the level early with
:class:`ServerGone`, instead of sending the rest to a dead port.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from moetune.bench.http.client import StreamingHttp
from moetune.bench.serve.request import CHAT_PATH, RequestRecord, stream_chat
from moetune.errors import RuntimeFailure
from moetune.option_defaults import ARRIVALS

GONE_AFTER = 3  # requests in a row without an answer, at least
# what a request that never reached a live server ends with (any retries spent), or that a hung
# server (stopped, deadlocked) never answered in full within the client's timeout
_UNANSWERED = ("connect_error", "connection_reset", "disconnected", "os_error", "timeout")


class ServerGone(RuntimeFailure):
    """The server stopped answering during a level: its samples so far are stored, the rest unsent."""

    def __init__(self, failed_in_a_row: int, last_error: str, records: list[RequestRecord], done: int) -> None:
        super().__init__(
            f"the server stopped answering: {failed_in_a_row} requests in a row got no answer "
            f"({last_error}); the level was stopped, {done} requests were measured",
            hint="the server crashed or was stopped; its log says why (`moetune doctor` for a launch)",
        )
        self.records = records  # empty unless run_level kept them
        self.done = done


class LoadMeter:
    """What the load generator is doing now, for the sampler and the live view: requests in flight,
    finished and failed, tokens received, and the median TTFT and ITL of the last requests. Raw
    records stay the source of every reported figure; these are only the live approximations."""

    RECENT = 32

    def __init__(self) -> None:
        self.in_flight = 0
        self.done = 0
        self.errors = 0
        self.output_tokens = 0
        self.level = ""
        self._ttft: deque[float] = deque(maxlen=self.RECENT)
        self._itl: deque[float] = deque(maxlen=self.RECENT)

    def started(self) -> None:
        self.in_flight += 1

    def finished(self, rec: RequestRecord) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        self.done += 1
        if rec.error is not None:
            self.errors += 1
        events = rec.events()
        arrivals = [float(e.t) for e in events if e.t is not None and e.tokens]
        tokens = sum(int(e.tokens or 0) for e in events)
        self.output_tokens += tokens
        if arrivals and rec.error is None:
            self._ttft.append(arrivals[0] - rec.t_sched)
            if tokens > 1:
                self._itl.append((arrivals[-1] - arrivals[0]) / (tokens - 1))

    def figures(self) -> dict[str, float]:
        out = {
            "requests_in_flight": float(self.in_flight),
            "requests_done_total": float(self.done),
            "errors_total": float(self.errors),
            "output_tokens_total": float(self.output_tokens),
        }
        if self._ttft:
            out["ttft_recent_median_seconds"] = statistics.median(self._ttft)
        if self._itl:
            out["itl_recent_median_seconds"] = statistics.median(self._itl)
        return out


def _unanswered(rec: RequestRecord) -> bool:
    return (
        rec.status is None
        and rec.error is not None
        and rec.error.split(":")[0].removesuffix("_after_retries") in _UNANSWERED
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    content: str  # the user message
    prompt_tokens: int | None  # the templated prompt's length in the server's tokens; None: not counted before
    max_tokens: int
    source: str | None = None  # "tokenizer": prompt_tokens is a local tokenizer's prediction; None: the server's

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.content}]


class ChatPrompt(Protocol):
    """What a request sends: its messages and how many tokens to generate (a :class:`Prompt`, or a
    session's turn, :class:`moetune.bench.serve.sessions.Turn`)."""

    @property
    def max_tokens(self) -> int: ...

    def messages(self) -> list[dict[str, str]]: ...


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request sent as it is (a replayed one): its body, the path it goes to, its max_tokens and,
    when it was counted before sending, its prompt's length."""

    body: bytes
    max_tokens: int
    path: str = CHAT_PATH
    prompt_tokens: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    concurrency: int
    requests: int | None = None  # stop after this many
    duration_s: float | None = None  # or stop sending after this long
    rate: float | None = None  # requests/s; None: closed loop
    arrivals: str = "poisson"
    seed: int = 0
    offsets: tuple[float, ...] | None = None  # open loop on these due times (s from the start), not a rate


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestOptions:
    model: str = "moetune"
    cache_prompt: bool = False  # llama-server's prefix cache; off unless asked
    thinking: bool | None = None  # chat_template_kwargs.enable_thinking; None leaves the server's default
    ignore_eos: bool = True  # generate exactly max_tokens
    timeout_s: float | None = None  # per request, retries included


def request_body(p: ChatPrompt, o: RequestOptions) -> bytes:
    doc: dict[str, object] = {
        "model": o.model,
        "messages": p.messages(),
        "stream": True,
        "max_tokens": p.max_tokens,
        # usage in every chunk where the server can (vLLM, SGLang): tokens per chunk, as timings_per_token
        # gives them on llama-server; usage at the end at least everywhere else
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "timings_per_token": True,
        "cache_prompt": o.cache_prompt,
        "ignore_eos": o.ignore_eos,
    }
    if o.thinking is not None:
        doc["chat_template_kwargs"] = {"enable_thinking": o.thinking}
    return json.dumps(doc).encode()


def arrival_offsets(rate: float, arrivals: str, seed: int) -> Iterator[float]:
    """Seconds from the start at which successive requests are due."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {ARRIVALS}")
    rng = random.Random(seed)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate) if arrivals == "poisson" else 1 / rate


async def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


async def run_level(
    http: StreamingHttp,
    prompts: Sequence[Prompt | Prepared],
    spec: LoadSpec,
    *,
    options: RequestOptions,
    on_sample: Callable[[RequestRecord], None],
    first_index: int = 0,
    progress: Callable[[int], None] | None = None,
    max_retries: int = 2,
    meter: LoadMeter | None = None,
    keep: bool = True,
) -> list[RequestRecord]:
    """Run one load level; return its records (each was also given to ``on_sample`` as it ended).
    With ``keep=False`` none are kept and the list is empty: a caller that stores each sample as it
    comes reads them back from there, and a long level does not pile its records up in memory."""
    if not prompts:
        raise ValueError("no prompts")
    if spec.requests is None and spec.duration_s is None:
        raise ValueError("give requests or duration_s")
    bodies = [p.body if isinstance(p, Prepared) else request_body(p, options) for p in prompts]
    records: list[RequestRecord] = []
    t0 = time.monotonic()
    stop_at = t0 + spec.duration_s if spec.duration_s is not None else None
    counter = itertools.count()
    in_a_row = 0
    done = 0
    last_error = ""
    gone_after = max(GONE_AFTER, spec.concurrency)

    def take() -> int | None:
        if in_a_row >= gone_after:
            return None
        i = next(counter)
        if spec.requests is not None and i >= spec.requests:
            return None
        if stop_at is not None and time.monotonic() >= stop_at:
            return None
        return i

    async def one(i: int, t_sched: float, t_slot: float | None) -> None:
        p = prompts[i % len(prompts)]
        path = p.path if isinstance(p, Prepared) else CHAT_PATH
        rec = RequestRecord(
            index=first_index + i,
            concurrency=spec.concurrency,
            rate=spec.rate,
            prompt_tokens=p.prompt_tokens,
            max_tokens=p.max_tokens,
            t_sched=t_sched,
            prompt_source=p.source if isinstance(p, Prompt) else None,
        )
        if t_slot is None:
            async with slots:
                rec.t_slot = time.monotonic()
                if meter:
                    meter.started()
                await stream_chat(
                    http, bodies[i % len(bodies)], rec, max_retries=max_retries, timeout_s=options.timeout_s, path=path
                )
        else:
            rec.t_slot = t_slot
            if meter:
                meter.started()
            await stream_chat(
                http, bodies[i % len(bodies)], rec, max_retries=max_retries, timeout_s=options.timeout_s, path=path
            )
        if meter:
            meter.finished(rec)
        nonlocal in_a_row, done, last_error
        in_a_row = in_a_row + 1 if _unanswered(rec) else 0
        done += 1
        last_error = rec.error or last_error
        if keep:
            records.append(rec)
        on_sample(rec)
        if progress:
            progress(done)

    slots = asyncio.Semaphore(spec.concurrency)
    if spec.rate is None and spec.offsets is None:

        async def worker() -> None:
            while (i := take()) is not None:
                t = time.monotonic()
                await one(i, t, t)

        async with asyncio.TaskGroup() as tg:
            for _ in range(spec.concurrency):
                tg.create_task(worker())
    else:
        async with asyncio.TaskGroup() as tg:
            due_times = (
                spec.offsets
                if spec.offsets is not None
                else arrival_offsets(spec.rate or 0.0, spec.arrivals, spec.seed)
            )
            for i, offset in enumerate(due_times):
                due = t0 + offset
                if spec.requests is not None and i >= spec.requests:
                    break
                if stop_at is not None and due >= stop_at:
                    break
                await _sleep_until(due)
                if in_a_row >= gone_after:
                    break
                tg.create_task(one(i, due, None))
    if in_a_row >= gone_after:
        raise ServerGone(in_a_row, last_error or "no answer", records, done)
    return records
