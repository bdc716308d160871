"""Agent sessions against a server: size the texts, run the conversations, store every turn.

The session model (:mod:`moetune.bench.serve.sessions`) says what each turn sends; this module
sends it. Each session runs as its own task: a turn is sent when the one before it has ended and
the client's think time has passed, with the history as the client keeps it. Turns are streamed
and recorded like every serve-bench request (:func:`moetune.bench.serve.request.stream_chat`,
:class:`RequestRecord`), stored as they end with their session and turn, and counted by the
sampler's :class:`LoadMeter`; the sampler's phase says the turn the run has reached.

Texts are sized in the server's tokens where it has ``/tokenize``, else in those of a
``--tokenizer`` given: each system prompt and turn message has exactly the asked number of tokens
as plain text (the chat template adds its own).
Elsewhere one probe fits characters to tokens (two requests for one token, whose
``usage.prompt_tokens`` differ by the probe text's tokens), and texts are cut to that many
characters: their lengths are then close, and the server's usage says the real ones.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from moetune.bench.analysis.serve import summarize_level
from moetune.bench.analysis.sessions import summarize_sessions
from moetune.bench.analysis.warnings import Warning, run_warnings
from moetune.bench.http.client import StreamingHttp
from moetune.bench.serve.dataset import ServerTokenCounter, TokenCounter, filler_text, fit_content
from moetune.bench.serve.load import (
    LoadMeter,
    LoadSpec,
    Prompt,
    RequestOptions,
    ServerGone,
    request_body,
    run_level,
)
from moetune.bench.serve.request import RequestRecord, stream_chat
from moetune.bench.serve.run import (
    SampleWriter,
    ServeBenchSpec,
    _connect,
    _gone_message,
    _model_name,
    finish_levels,
    report_doc,
    serve_bench,
    serve_run_meta,
)
from moetune.bench.serve.sessions import Reply, SessionSpec, SessionTexts, Turn, session_tag, turn_request
from moetune.bench.serve.tokenizer import TokenizerCounter, token_counter
from moetune.bench.servers import PlanServers, ServerSource
from moetune.errors import RuntimeFailure
from moetune.jsonread import mapping, number
from moetune.kinds import RunStatus
from moetune.monitor.sampler import RunMonitor
from moetune.monitor.snapshot import Snapshot
from moetune.store.db import ResultsDB

PROBE_CHARS = 2000  # characters of the probe that fits characters to tokens on a server without /tokenize


class _TextTokens:
    """A :class:`TokenCounter` whose "chat" count is the plain text's: messages sized as text."""

    def __init__(self, counter: ServerTokenCounter | TokenizerCounter) -> None:
        self.counter = counter

    async def chat_tokens(self, content: str) -> int:
        return await self.counter.text_tokens(content)

    async def text_tokens(self, text: str) -> int:
        return await self.counter.text_tokens(text)


async def _exact_text(
    counter: _TextTokens, prefix: str, target: int, *, seed: int, per_char: float | None
) -> tuple[str, float]:
    """``prefix`` and filler of exactly ``target`` tokens (or the nearest count below), and the
    tokens per character measured on the way."""
    filler = filler_text(seed, max(64, target * 2))
    while await counter.chat_tokens(prefix + filler) < target:
        filler += " " + filler_text(seed + len(filler), max(64, target))
    start = round(target / per_char) if per_char else len(filler) // 2
    text, count = await fit_content(counter, prefix, filler, target=target, start=start, per_char=per_char)
    return text, max(1e-3, count / max(1, len(text)))


async def _calibrated(counter: TokenCounter, seed: int) -> float:
    """Tokens per character of the filler, from the server's count of two prompts."""
    probe = filler_text(seed, PROBE_CHARS)[:PROBE_CHARS]
    empty, full = await counter.chat_tokens(""), await counter.chat_tokens(probe)
    return max(1e-3, (full - empty) / len(probe))


async def session_texts(
    counter: TokenCounter, spec: SessionSpec, run_tag: str, *, seed: int, exact: bool
) -> list[SessionTexts]:
    """Each session's system prompt (unique: it starts with the session's tag) and turn messages
    (the same for every session: their histories differ from the first token already)."""
    if exact:
        assert isinstance(counter, ServerTokenCounter | TokenizerCounter)
        tc = _TextTokens(counter)
        per_char: float | None = None
        turns: list[str] = []
        for t in range(spec.turns):
            text, per_char = await _exact_text(tc, "", spec.turn_tokens, seed=seed + 1 + t, per_char=per_char)
            turns.append(text)
        systems = []
        for s in range(spec.sessions):
            text, per_char = await _exact_text(
                tc, session_tag(run_tag, s), spec.system_tokens, seed=seed, per_char=per_char
            )
            systems.append(text)
    else:
        rate = await _calibrated(counter, seed)

        def cut(prefix: str, tokens: int, sd: int) -> str:
            n = max(1, round(tokens / rate) - len(prefix))
            filler = filler_text(sd, n)  # n words are at least n characters
            return prefix + filler[:n]

        turns = [cut("", spec.turn_tokens, seed + 1 + t) for t in range(spec.turns)]
        systems = [cut(session_tag(run_tag, s), spec.system_tokens, seed) for s in range(spec.sessions)]
    return [SessionTexts(system, tuple(turns)) for system in systems]


async def run_sessions(
    http: StreamingHttp,
    texts: list[SessionTexts],
    spec: SessionSpec,
    *,
    options: RequestOptions,
    on_sample: Callable[[dict[str, object]], None],
    meter: LoadMeter | None = None,
    on_turn: Callable[[int], None] | None = None,
    max_retries: int = 2,
) -> list[dict[str, object]]:
    """Run every session to its last turn, or to its first failed one (a conversation does not go
    on without its reply); return the samples (each also given to ``on_sample`` as it ended).
    Raises :class:`ServerGone` when every session ended on a request the server never answered."""
    samples: list[dict[str, object]] = []
    records: list[RequestRecord] = []
    last: dict[int, RequestRecord] = {}
    index = itertools.count()
    reached = 0
    t0 = time.monotonic()

    async def one(s: int) -> None:
        nonlocal reached
        replies: list[Reply] = []
        due = t0
        for _ in range(spec.turns):
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            turn = turn_request(s, texts[s], replies, spec)
            if turn.turn > reached:
                reached = turn.turn
                if on_turn:
                    on_turn(reached)
            rec, reply = await _send(
                http, turn, spec, options=options, index=next(index), due=due, meter=meter, max_retries=max_retries
            )
            sample = {
                **rec.to_sample(),
                "session": s,
                "turn": turn.turn,
                "messages": len(turn.history),
                "stripped_chars": turn.stripped_chars,
            }
            samples.append(sample)
            records.append(rec)
            last[s] = rec
            on_sample(sample)
            if rec.error is not None:
                return
            replies.append(reply)
            due = rec.t_end + spec.think_time_s

    if spec.sequential:
        for s in range(len(texts)):
            await one(s)
    else:
        async with asyncio.TaskGroup() as tg:
            for s in range(len(texts)):
                tg.create_task(one(s))
    failed = [r for r in last.values() if r.error is not None and r.status is None]
    if last and len(failed) == len(last):
        raise ServerGone(len(failed), failed[-1].error or "no answer", records, len(records))
    return samples


async def _send(
    http: StreamingHttp,
    turn: Turn,
    spec: SessionSpec,
    *,
    options: RequestOptions,
    index: int,
    due: float,
    meter: LoadMeter | None,
    max_retries: int,
) -> tuple[RequestRecord, Reply]:
    rec = RequestRecord(
        index=index, concurrency=spec.streams, rate=None, prompt_tokens=None, max_tokens=turn.max_tokens, t_sched=due
    )
    rec.t_slot = time.monotonic()
    content: list[str] = []
    reasoning: list[str] = []

    def keep(c: str, r: str) -> None:
        content.append(c)
        reasoning.append(r)

    if meter:
        meter.started()
    await stream_chat(
        http, request_body(turn, options), rec, max_retries=max_retries, timeout_s=options.timeout_s, on_text=keep
    )
    if meter:
        meter.finished(rec)
    return rec, Reply("".join(content), "".join(reasoning))


def _turn_line(doc: Mapping[str, object]) -> str:
    """One entry of :func:`moetune.bench.analysis.sessions.per_turn` as a progress line."""

    def f(key: str, fmt: str = ".0f") -> str:
        x = number(mapping(doc.get(key)).get("p50"))
        return "-" if x is None else format(x, fmt)

    return (
        f"turn {doc['turn']}: {doc['ok']}/{doc['requests']} ok, context p50 {f('context_tokens')}, "
        f"processed p50 {f('prompt_tokens_processed')}, reused p50 "
        f"{f('prompt_tokens_reused')} tokens, TTFT p50 {f('ttft_ms', '.1f')} ms, "
        f"TG p50 {f('tg_tok_s', '.1f')} tok/s"
    )


async def bench_sessions(
    spec: ServeBenchSpec,
    source: ServerSource,
    db: ResultsDB,
    *,
    log: Callable[[str], None],
    monitor: RunMonitor,
    meter: LoadMeter,
    sweep_id: str | None = None,
    details: dict[str, object] | None = None,
) -> dict[str, Any]:
    """The sessions workload (``spec.sessions``) as one serve-bench run: its requests are one load
    level (concurrency = sessions), and the ``sessions`` section gives them per turn and session;
    ``sweep_id`` files it under a sweep or a tune, ``details`` adds to what the run records."""
    ss = spec.sessions
    assert ss is not None
    http: StreamingHttp | None = None
    run_id: int | None = None
    writer: SampleWriter | None = None
    levels: list[dict[str, object]] = []
    sessions_doc: dict[str, object] | None = None
    advice: list[Warning] = []
    status = RunStatus.FAILED
    error: str | None = None
    slots: int | None = None
    try:
        monitor.phase(f"launch c={ss.streams}" if isinstance(source, PlanServers) else None)
        url, _ = source.url_for(ss.streams)
        http, info = await _connect(spec, url)
        slots = info.slots
        monitor.phase("prepare")
        model = spec.model or await _model_name(http)
        run_tag = os.urandom(2).hex()
        counter = token_counter(
            http,
            info,
            model,
            spec.thinking,
            tokenizer=spec.tokenizer,
            log=log,
            probe_tag=f"{run_tag}.probe",
            seed=spec.seed,
        )
        t = time.monotonic()
        local = counter.describe() if isinstance(counter, TokenizerCounter) else None
        texts = await session_texts(counter, ss, run_tag, seed=spec.seed, exact=info.caps.tokenize or bool(local))
        how = (
            "exact token counts"
            if info.caps.tokenize
            else "lengths counted by --tokenizer"
            if local
            else "lengths fitted to the server's usage.prompt_tokens (no /tokenize)"
        )
        log(
            f"prepared {ss.sessions} sessions of {ss.turns} turns, {how} ({counter.calls} calls, "
            f"{time.monotonic() - t:.1f} s)"
        )
        advice = run_warnings(info, [ss.streams], 0, tokenizer=local)
        assert spec.sessions is not None
        meta = serve_run_meta(
            spec,
            source,
            info,
            model=model,
            run_tag=run_tag,
            sessions=spec.sessions.to_json(),
            tokenizer=local,
            details=details,
        )
        label = spec.label or f"sessions {ss.sessions}x{ss.turns}" + (" stripped" if ss.strip_thinking else "")
        run_id = db.create_run(meta, label=label, target=source.target, sweep_id=sweep_id)
        monitor.attach(db, run_id)
        writer = w = SampleWriter(db, run_id)
        options = RequestOptions(model=model, cache_prompt=True, thinking=spec.thinking, timeout_s=spec.timeout_s)
        if spec.warmup:  # one by one, each its own conversation, stored apart
            monitor.phase("warmup")
            warm = [Prompt(f"{run_tag}.w{i} {texts[0].turns[0]}", None, ss.output_len) for i in range(spec.warmup)]
            await run_level(
                http,
                warm,
                LoadSpec(concurrency=1, requests=spec.warmup),
                options=options,
                on_sample=lambda r: w.add(r.to_sample(), "warmup"),
                first_index=-spec.warmup,
            )
        try:
            samples = await run_sessions(
                http,
                texts,
                ss,
                options=options,
                on_sample=lambda s: w.add(s, "measure"),
                meter=meter,
                on_turn=lambda n: monitor.phase(f"turn {n}"),
            )
        except ServerGone as gone:
            level = summarize_level([r.to_sample() for r in gone.records], spec.slo)
            level["stopped"] = str(gone)
            levels.append(level)
            error = _gone_message(gone, ss.streams, source)
            log(error)
            raise RuntimeFailure(error, hint=gone.hint) from None
        level = summarize_level(samples, spec.slo)
        level["server"] = {**info.to_json(), **source.level_info(ss.streams)}
        levels.append(level)
        sessions_doc = summarize_sessions(samples, ss.to_json(), slots=slots)
        turns = sessions_doc["turns"]
        for turn in turns if isinstance(turns, list) else []:
            log(_turn_line(turn))
        status = RunStatus.DONE
    except (KeyboardInterrupt, asyncio.CancelledError):
        status = RunStatus.INTERRUPTED
        raise
    finally:
        if http is not None:
            await http.aclose()
        if writer is not None and run_id is not None:
            finish_levels(
                db,
                run_id,
                writer,
                status=status,
                levels=levels,
                advice=advice,
                slots=slots,
                prefix_cache=True,
                error=error,
                extra={"sessions": sessions_doc},
            )
    assert run_id is not None and writer is not None
    return report_doc(db.run(run_id), levels, advice, samples=writer.count, slo=spec.slo, sessions=sessions_doc)


def serve_sessions(
    spec: ServeBenchSpec,
    db: ResultsDB,
    *,
    log: Callable[[str], None] = lambda s: None,
    source: ServerSource | None = None,
    on_snapshot: Callable[[Snapshot], None] | None = None,
) -> dict[str, Any]:
    """:func:`moetune.bench.serve.run.serve_bench` with the sessions workload (``spec.sessions``)."""
    if spec.sessions is None:
        raise ValueError("spec.sessions is not set")
    return serve_bench(spec, db, log=log, source=source, on_snapshot=on_snapshot, workload=bench_sessions)
