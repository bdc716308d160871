"""The multiple-choice soak: every question asked of a server, greedy, one request at a time; each
answer stored as a sample of a run of kind ``qa`` as it comes; the figures from
:mod:`moetune.quality.stats` (Wilson interval, McNemar's exact test against the first run).

A request is an OpenAI chat completion: the prompt of :func:`moetune.quality.qa.prompt` as the user
message, ``temperature`` 0 and ``seed`` 0 (greedy), ``max_tokens``, and with thinking ``off`` (the
default) ``chat_template_kwargs: {"enable_thinking": false}``. The reply's ``content`` is read by
:func:`moetune.quality.qa.extract` (``reasoning_content`` is never read).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moetune import __version__
from moetune.errors import RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.quality import qa, stats
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, RunMeta

Progress = Callable[[int, int], None]
REPLY_KEPT_CHARS = 400


@dataclass(frozen=True, slots=True, kw_only=True)
class SoakOptions:
    thinking: str = "off"  # off | on | template (send none)
    max_tokens: int = 16
    model: str | None = None
    timeout_s: float = 600.0
    conf: float = stats.DEFAULT_CONF
    alpha: float = 0.05


@dataclass(frozen=True, slots=True)
class SoakRun:
    label: str
    run_id: int
    target: str
    answers: tuple[tuple[str | None, bool], ...]  # (letter or None, right), in question order

    @property
    def n(self) -> int:
        return len(self.answers)

    @property
    def right(self) -> int:
        return sum(1 for _, ok in self.answers if ok)

    @property
    def unparsable(self) -> int:
        return sum(1 for a, _ in self.answers if a is None)

    @property
    def accuracy(self) -> float:
        return self.right / self.n if self.n else 0.0

    def interval(self, conf: float) -> tuple[float, float]:
        return stats.wilson(self.right, self.n, conf=conf)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFigures:
    label: str
    run_id: int
    target: str
    n: int
    right: int
    unparsable: int
    accuracy: float
    ci_low: float
    ci_high: float

    def to_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "run": self.run_id,
            "target": self.target,
            "n": self.n,
            "right": self.right,
            "unparsable": self.unparsable,
            "accuracy": {"mean": self.accuracy, "ci_low": self.ci_low, "ci_high": self.ci_high, "method": "wilson"},
        }


@dataclass(frozen=True, slots=True)
class SoakReport:
    n_questions: int
    conf: float
    runs: list[RunFigures]
    paired: list[stats.Paired]  # each run after the first against the first

    def to_json(self) -> dict[str, object]:
        return {
            "questions": self.n_questions,
            "confidence": self.conf,
            "runs": [r.to_json() for r in self.runs],
            "paired": [
                {
                    "baseline": self.runs[0].label,
                    "candidate": r.label,
                    **p.to_json(),
                    "test": "McNemar exact (two-sided binomial on the discordant pairs)",
                }
                for r, p in zip(self.runs[1:], self.paired, strict=True)
            ],
        }


def report(runs: Sequence[SoakRun], conf: float = stats.DEFAULT_CONF, alpha: float = 0.05) -> SoakReport:
    figs = [
        RunFigures(
            label=r.label,
            run_id=r.run_id,
            target=r.target,
            n=r.n,
            right=r.right,
            unparsable=r.unparsable,
            accuracy=r.accuracy,
            ci_low=lo,
            ci_high=hi,
        )
        for r in runs
        for lo, hi in (r.interval(conf),)
    ]
    return SoakReport(
        runs[0].n if runs else 0, conf, figs, [stats.paired(runs[0].answers, r.answers, alpha=alpha) for r in runs[1:]]
    )


def request_body(q: qa.Question, opt: SoakOptions) -> dict[str, object]:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": qa.prompt(q)}],
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": opt.max_tokens,
        "stream": False,
    }
    if opt.model:
        body["model"] = opt.model
    if opt.thinking != "template":
        body["chat_template_kwargs"] = {"enable_thinking": opt.thinking == "on"}
    return body


def reply_text(doc: Any) -> str:
    try:
        content = doc["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content if isinstance(content, str) else ""


async def _ask_all(
    url: str,
    questions: Sequence[qa.Question],
    opt: SoakOptions,
    on_reply: Callable[[int, str, dict[str, object]], None],
) -> None:
    from moetune.bench.http.client import connect

    http = connect(url, timeout_s=opt.timeout_s)
    try:
        for i, q in enumerate(questions):
            t0 = time.monotonic()
            try:
                status, doc = await http.post_json("/v1/chat/completions", request_body(q, opt))
            except Exception as e:
                raise RuntimeFailure(
                    f"{url}: question {q.id}: {type(e).__name__}: {e}",
                    hint="is the server up? (`moetune bench URL` checks it)",
                ) from None
            if status != 200:
                raise RuntimeFailure(f"{url}: question {q.id}: HTTP {status}: {str(doc)[:300]}")
            on_reply(
                i,
                reply_text(doc),
                {"latency_s": time.monotonic() - t0, "usage": doc.get("usage") if isinstance(doc, dict) else None},
            )
    finally:
        await http.aclose()


def soak(
    db: ResultsDB,
    url: str,
    questions: Sequence[qa.Question],
    opt: SoakOptions,
    *,
    label: str,
    target: str,
    details: Mapping[str, object] | None = None,
    meta: dict[str, Any] | None = None,  # RunMeta's fields
    progress: Progress | None = None,
) -> SoakRun:
    """Ask every question of the server at ``url``; store each answer as it comes."""
    from moetune.bench.http.clock import run as run_loop

    m = RunMeta(
        kind=RunKind.QA,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        host=HostRef.here(),
        details={
            "questions": len(questions),
            "url": url,
            "thinking": opt.thinking,
            "max_tokens": opt.max_tokens,
            "model": opt.model,
            "rule": "moetune.quality.qa.extract",
            **(details or {}),
        },
        **(meta or {}),
    )
    run_id = db.create_run(m, label=label, target=target)
    answers: list[tuple[str | None, bool]] = []

    def on_reply(i: int, text: str, extra: dict[str, object]) -> None:
        q = questions[i]
        a = qa.extract(text, q)
        ok = a == qa.right_letter(q)
        answers.append((a, ok))
        db.add_sample(
            run_id,
            {
                "id": q.id,
                "answer": a,
                "expected": qa.right_letter(q),
                "right": ok,
                "reply": text[:REPLY_KEPT_CHARS],
                **extra,
            },
        )
        if progress:
            progress(i + 1, len(questions))

    try:
        run_loop(_ask_all(url, questions, opt, on_reply))
    except BaseException as e:
        db.finish_run(
            run_id,
            RunStatus.INTERRUPTED if isinstance(e, KeyboardInterrupt) else RunStatus.FAILED,
            {"error": str(e), "answered": len(answers)},
        )
        raise
    r = SoakRun(label, run_id, target, tuple(answers))
    lo, hi = r.interval(opt.conf)
    db.finish_run(
        run_id,
        RunStatus.DONE,
        {
            "n": r.n,
            "right": r.right,
            "unparsable": r.unparsable,
            "accuracy": {"mean": r.accuracy, "ci_low": lo, "ci_high": hi, "method": "wilson"},
        },
    )
    return r
