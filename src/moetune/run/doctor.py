"""Findings in logs a user would otherwise read by hand. Pure: parsed logs in, findings out.

Each finding has a one-line title with the numbers, a remedy, and the log lines that show it:

- prefix_cache_miss   the cached prompt stopped matching; tokens re-evaluated; a ``<think>``
                      block at the divergence named as the cause where it is one (requests
                      that asked for no cache, ``cache_prompt: false``, are not misses)
- split_mode_fallback ``-sm graph`` (ik_llama.cpp) fell back to ``layer``
- slot_queueing       requests waited because every ``--parallel`` slot was busy
- checkpoint_restores context checkpoints (hybrid recurrent, sliding-window models) that spared
                      requests a full prompt re-processing, the cached tokens they kept, the
                      requests that re-processed anyway, and the host memory the checkpoints held
- rdma_unrequested    an RPC connection switched to RDMA although nothing asked for it
- thinking_dominant   reasoning tokens are most of the output (from response captures)
- pinned_near_ram     pinned host memory close to the machine's RAM
- load_failed         the log ends in a failed load (the launch diagnosis)
- repack_crash        the engine crashed at load with repacked CPU weights (remedy: --repack off)
- rpc_worker_stale    a server crashed connecting to an RPC worker its run did not start (remedy:
                      restart the worker)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import moetune.run.diagnose as diagnose
from moetune.engine.logs import CacheMiss, Evidence, ServerLog, WorkerLog
from moetune.engine.logs.types import TEMPLATE_UNSUPPORTED

# a <think> tag, or the start of one cut off where the engine stopped printing the divergence
THINK = re.compile(r"</?think|think>|</?t(?:h(?:i(?:n(?:k)?)?)?)?$")
PINNED_RAM_SHARE = 0.85  # pinned memory above this share of RAM leaves too little for the rest
PINNED_RAM_MARGIN_MIB = 16 * 1024.0  # ... and so does less than this left over
THINKING_SHARE = 0.5
MAX_EVIDENCE = 6


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """One chat completion response (or a bench sample) a user captured."""

    line: int  # where it sits in its file (1-based)
    completion_tokens: int | None
    reasoning_chars: int
    content_chars: int
    reasoning_tokens: int | None = None  # where the server counted them

    @property
    def reasoning_share(self) -> float:
        total = self.reasoning_chars + self.content_chars
        return self.reasoning_chars / total if total else 0.0

    def reasoning_tokens_est(self) -> float:
        if self.reasoning_tokens is not None:
            return float(self.reasoning_tokens)
        return (self.completion_tokens or 0) * self.reasoning_share


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """One input: a server log, a worker log or a file of responses, with what is known around it."""

    name: str
    server: ServerLog | None = None
    worker: WorkerLog | None = None
    responses: tuple[Response, ...] = ()
    response_lines: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None  # the process's environment, when read from a run
    ram_mib: float | None = None  # the machine's RAM, when the run recorded it
    exit_code: int | None = None  # how the process ended, when the run recorded it
    rpc_outside: tuple[str, ...] = ()  # the RPC workers a server used that its run did not start
    rpc_workers: Mapping[str, WorkerLog] | None = None  # the logs of those it started, by endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    code: str
    source: str
    title: str
    remedy: str
    evidence: tuple[Evidence, ...]
    data: dict[str, object] = field(default_factory=dict)  # the figures behind the finding, for --json

    def to_json(self) -> dict[str, object]:
        return {
            "code": self.code,
            "source": self.source,
            "title": self.title,
            "remedy": self.remedy,
            "evidence": [{"line": e.line, "text": e.text} for e in self.evidence],
            "data": self.data,
        }


def examine(sources: Sequence[Source], *, ram_mib: float | None = None) -> list[Finding]:
    out: list[Finding] = []
    for s in sources:
        if s.server is not None:
            out += _server(s, s.server, ram_mib if ram_mib is not None else s.ram_mib)
        if s.worker is not None:
            out += _worker(s, s.worker)
        if s.responses:
            out += _thinking(s)
    return out


_CRASHES = (diagnose.REPACK_CRASH, diagnose.RPC_STALE)


def _server(s: Source, log: ServerLog, ram_mib: float | None) -> list[Finding]:
    out = []
    name = s.name.rsplit("/", 1)[-1]
    loading = log.phase != "ready"
    d = diagnose.server_exit(name, log, s.exit_code, loading=loading, rpc_outside=s.rpc_outside, workers=s.rpc_workers)
    if log.failed or d.cause in _CRASHES:  # a crash's log may have no failure line
        code = d.cause if d.cause in _CRASHES else "load_failed"
        out.append(
            Finding(
                code=code,
                source=s.name,
                title=d.message,
                remedy=d.hint,
                evidence=d.evidence[:MAX_EVIDENCE],
                data={"cause": d.cause, "exit_code": s.exit_code},
            )
        )
    for f in log.failures:
        if f.kind == TEMPLATE_UNSUPPORTED:
            out.append(
                Finding(
                    code="template_unsupported",
                    source=s.name,
                    title=f"the server cannot apply the model's chat template ({f.subject}): chat requests "
                    "fail with HTTP 500",
                    remedy="start ik_llama.cpp with --jinja (the commands moetune renders for it have it), or "
                    "give it a --chat-template it knows",
                    evidence=(log.evidence(f.line),),
                    data={},
                )
            )
    if log.cache_misses:  # requests that asked for no cache (bench's cache_prompt false) are not among them
        out.append(_cache_misses(s.name, log, log.cache_misses))
    for c in log.split_mode_changes:
        out.append(
            Finding(
                code="split_mode_fallback",
                source=s.name,
                title=f"split mode '{c.requested}' fell back to '{c.actual}' ({c.reason})",
                remedy=f"drop -sm {c.requested} for this model, it runs as -sm {c.actual} anyway; "
                "place the experts with -ot instead",
                evidence=(
                    log.evidence(c.line),
                    *(log.evidence(n) for n in range(c.line + 1, c.line + 2) if n <= len(log.lines)),
                ),
                data={"requested": c.requested, "actual": c.actual},
            )
        )
    if log.slot_waits:
        out.append(_queueing(s.name, log))
    if log.checkpoint_restores or (log.checkpoints_created and log.full_reprocessing):
        out.append(_checkpoints(s.name, log))
    pinned = log.pinned_host_mib()
    cpu = log.device("CPU")
    ram = ram_mib if ram_mib is not None else (cpu.total_mib if cpu else None)
    if pinned and ram and (pinned >= PINNED_RAM_SHARE * ram or ram - pinned < PINNED_RAM_MARGIN_MIB):
        lines = [p.line for p in log.pinned] or [b.line for b in log.buffers if b.device.endswith("_Host")]
        out.append(
            Finding(
                code="pinned_near_ram",
                source=s.name,
                title=f"pinned host memory {pinned / 1024:.1f} GiB is {pinned / ram:.0%} of RAM "
                f"({ram / 1024:.0f} GiB), {max(ram - pinned, 0) / 1024:.1f} GiB left for everything else",
                remedy="pin fewer expert tensors: more of them on the GPUs or a smaller quant; --no-host "
                "(mainline) keeps CPU tensors pageable at some prefill cost",
                evidence=tuple(log.evidence(n) for n in lines[:MAX_EVIDENCE]),
                data={"pinned_mib": pinned, "ram_mib": ram},
            )
        )
    return out


def _is_think(m: CacheMiss) -> bool:
    """The texts diverge at a think tag: right where they stop agreeing, one of them has one (with
    only one text printed, anywhere in it). A tag further on is just the template's."""
    a, b = m.cache_text or "", m.prompt_text or ""
    if not (a and b):
        return any(THINK.search(t) for t in (a, b))
    k = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return any(THINK.search(t[max(0, k - 7) : k + 10]) for t in (a, b))


def _cache_misses(name: str, log: ServerLog, misses: Sequence[CacheMiss]) -> Finding:
    reeval = sum(m.reevaluated_tokens or 0 for m in misses)
    discarded = sum(m.discarded_tokens or 0 for m in misses)
    think = [m for m in misses if _is_think(m)]
    title = (
        f"{len(misses)} prefix-cache {'miss' if len(misses) == 1 else 'misses'}: {reeval} prompt tokens "
        f"re-evaluated ({discarded} cached tokens thrown away)"
    )
    if log.uncached_requests:
        title += (
            f"; {len(log.uncached_requests)} requests asked for no cache (cache_prompt false, as "
            "moetune bench sends) and are not counted"
        )
    if think:
        title += f"; {len(think)} of them diverge at a <think> block"
        remedy = (
            "the client sends earlier assistant turns back without their <think>...</think> block, so the "
            "cache stops matching there: send the history as the server produced it, or turn thinking off "
            "(chat_template_kwargs enable_thinking=false) so there is no block to drop"
        )
    else:
        remedy = (
            "the prompt changes early (a date, a system prompt, another client on the same slot): keep the "
            "stable part first, and give concurrent clients their own slots (--parallel)"
        )
    shown = (think or list(misses))[:2]
    lines = sorted({n for m in shown for n in m.lines})
    return Finding(
        code="prefix_cache_miss",
        source=name,
        title=title,
        remedy=remedy,
        evidence=tuple(log.evidence(n) for n in lines[: MAX_EVIDENCE * 2]),
        data={
            "misses": len(misses),
            "reevaluated_tokens": reeval,
            "discarded_tokens": discarded,
            "think_misses": len(think),
            "uncached_requests": len(log.uncached_requests),
        },
    )


def _checkpoints(name: str, log: ServerLog) -> Finding:
    """Restores: each one a prompt the server went on with from a checkpoint, where without it the
    whole prompt is evaluated again (``forcing full prompt re-processing``)."""
    restores, forced = log.checkpoint_restores, log.full_reprocessing
    kept = sum(c.tokens_kept for c in restores)
    peak: dict[int | None, int] = {}
    for c in log.checkpoints_created:
        peak[c.slot] = max(peak.get(c.slot, 0), c.index or 1)
    size = max((c.size_mib for c in (*log.checkpoints_created, *restores)), default=0.0)
    held = sum(peak.values()) * size
    title = (
        f"{len(restores)} context checkpoint restore{'' if len(restores) == 1 else 's'} avoided as many full "
        f"prompt re-processings ({kept:,} cached tokens reused)"
    )
    if forced:
        title += f"; {len(forced)} request{' was' if len(forced) == 1 else 's were'} re-processed in full anyway"
    if peak:
        title += (
            f"; checkpoints of {size:.3f} MiB held up to {held:,.1f} MiB of host RAM ({max(peak.values())} per slot)"
        )
    if forced:
        remedy = (
            "a prompt diverged before the earliest checkpoint its slot kept: keep the stable part of prompts "
            "first, raise --ctx-checkpoints (the plan counts their host RAM), and on mainline lower "
            "--checkpoint-min-step so that checkpoints lie closer together"
        )
    else:
        remedy = (
            "nothing to fix: the checkpoints work; they take host RAM as prompts are processed, which the "
            "plan's ledger counts (its checkpoints item, --ctx-checkpoints N)"
        )
    lines = [c.line for c in restores[: MAX_EVIDENCE // 2]] + list(forced[: MAX_EVIDENCE // 2])
    return Finding(
        code="checkpoint_restores",
        source=name,
        title=title,
        remedy=remedy,
        evidence=tuple(log.evidence(n) for n in sorted(lines)),
        data={
            "restores": len(restores),
            "tokens_kept": kept,
            "full_reprocessing": len(forced),
            "created": len(log.checkpoints_created),
            "checkpoint_mib": size,
            "held_mib": round(held, 3),
        },
    )


def _queueing(name: str, log: ServerLog) -> Finding:
    waits = log.slot_waits
    n_slots = log.context.n_slots
    waited = [w.waited_s for w in waits if w.waited_s is not None]
    longest = f", up to {max(waited):.3g} s" if waited else ""
    slots = f"--parallel {n_slots}" if n_slots else "--parallel"
    lines = sorted({n for w in waits[: MAX_EVIDENCE // 2] for n in (w.line, w.started_line) if n})
    return Finding(
        code="slot_queueing",
        source=name,
        title=f"{len(waits)} requests waited for a free slot ({slots}){longest}",
        remedy="raise --parallel to the number of concurrent clients, and -c with it (the context is divided "
        "among the slots); otherwise concurrency only queues and time to first token grows",
        evidence=tuple(log.evidence(n) for n in lines),
        data={"waits": len(waits), "n_slots": n_slots, "max_wait_s": max(waited) if waited else None},
    )


def _rdma_requested(env: Mapping[str, str] | None) -> bool | None:
    if env is None:
        return None
    if env.get("MOETUNE_TRANSPORT") in ("rdma", "auto"):  # `moetune launch --transport` asked for it
        return True
    dev = env.get("GGML_RDMA_DEV", "")
    return bool(dev) and dev != "disabled" and "GGML_RPC_NO_RDMA" not in env


def _worker(s: Source, log: WorkerLog) -> list[Finding]:
    used = log.rdma_activated or log.rdma_probed
    asked = _rdma_requested(s.env)
    if not used or asked:
        return []
    why = (
        "GGML_RDMA_DEV was not set"
        if asked is False
        else "this build negotiates RDMA on its own whenever a RoCE device matches the address"
    )
    ev = [e.line for e in (*log.rdma_probed, *log.rdma_activated)]
    if log.transport:
        ev.insert(0, next(n for n, x in enumerate(log.lines, 1) if "transport" in x))
    return [
        Finding(
            code="rdma_unrequested",
            source=s.name,
            title=f"RPC transport switched to RDMA without being asked ({why})",
            remedy="choose the transport explicitly: GGML_RDMA_DEV=<device> for RDMA, GGML_RPC_NO_RDMA=1 for TCP; "
            "confirm it in the worker's log, and stop servers before workers (an RDMA worker stopped "
            "first crashes its client)",
            evidence=tuple(log.evidence(n) for n in ev[:MAX_EVIDENCE]),
            data={"transport": log.transport},
        )
    ]


def _thinking(s: Source) -> list[Finding]:
    rs = [r for r in s.responses if r.completion_tokens]
    total = sum(r.completion_tokens or 0 for r in rs)
    thinking = sum(r.reasoning_tokens_est() for r in rs)
    if not total or thinking / total <= THINKING_SHARE:
        return []
    worst = sorted(rs, key=lambda r: -r.reasoning_share)[:3]
    ev = tuple(Evidence(r.line, s.response_lines[r.line - 1][:200]) for r in worst if r.line <= len(s.response_lines))
    return [
        Finding(
            code="thinking_dominant",
            source=s.name,
            title=f"thinking is {thinking / total:.0%} of the output: about {thinking:.0f} of {total} generated "
            f"tokens in {len(rs)} responses",
            remedy='for short answers turn thinking off: chat_template_kwargs {"enable_thinking": false} per '
            "request, or --reasoning-budget 0 / --reasoning off on the server",
            evidence=ev,
            data={"thinking_tokens": round(thinking), "completion_tokens": total, "responses": len(rs)},
        )
    ]
