"""`moetune quality`: does a plan change the answers? Plans against a reference plan, teacher-forced
(KL divergence, top-1 agreement, perplexity by the engine's llama-perplexity), or a multiple-choice
soak (``qa``) against servers or the plans launched one after another, paired with the first."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.app.progress import Callbacks
from moetune.errors import InputError

if TYPE_CHECKING:
    from moetune.bench.single.runner import Progress
    from moetune.quality.kld import Candidate, Reference
    from moetune.quality.soak import SoakReport


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityRequest:
    """What `moetune quality` was asked: ``plans`` (REFERENCE CANDIDATE...) teacher-forced, or with
    ``qa`` the questions of that file asked of each of ``urls`` and ``plans``."""

    plans: tuple[Path, ...] = ()
    text: Path | None = None  # the evaluation text (default: moetune's own)
    ctx: int = 256
    chunks: int | None = None
    labels: tuple[str, ...] = ()  # one per configuration, in order
    server: str | None = None  # plans with several servers: the one to evaluate
    launch_timeout_s: float = 600.0
    timeout_s: float = 3600.0
    confidence: float = 0.95
    seed: int = 0
    db_path: Path | None = None
    qa: Path | None = None
    qa_format: str = "jsonl"
    urls: tuple[str, ...] = ()
    limit: int | None = None
    thinking: str = "off"
    max_tokens: int = 16
    model: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KldResult:
    reference: Reference
    candidates: list[Candidate]
    text: Path
    ctx: int
    confidence: float
    db: str

    def to_json(self) -> dict[str, object]:
        from moetune.quality.stats import CLOSE_KLD, SAME_KLD

        return {
            "reference": self.reference.to_json(),
            "candidates": [c.to_json() for c in self.candidates],
            "text": str(self.text),
            "ctx": self.ctx,
            "confidence": self.confidence,
            "rule": {
                "same_kld_below": SAME_KLD,
                "close_kld_below": CLOSE_KLD,
                "interval": "bootstrap over chunks (>= 5), else the engine's ±",
            },
            "db": self.db,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class QaResult:
    report: SoakReport
    db: str

    def to_json(self) -> dict[str, object]:
        return {**self.report.to_json(), "db": self.db}


def kld(req: QualityRequest, cb: Callbacks | None = None) -> KldResult:
    """Each candidate plan's KL divergence from the reference plan's logits (saved once, reused)."""
    from moetune.bench.target import plan_target
    from moetune.quality.kld import EvalOptions, eval_text, evaluate
    from moetune.store.db import ResultsDB

    cb = cb or Callbacks()
    for p in req.plans:
        if not p.is_file():
            raise InputError(f"{p}: no such plan file", hint="write one with `moetune plan MODEL --hw HW -o FILE`")
    targets = [plan_target(p, req.server) for p in req.plans]
    if req.labels:
        if len(req.labels) != len(targets):
            raise InputError(f"{len(req.labels)} --label for {len(targets)} plans", hint="give one --label per plan")
        targets = [replace(t, doc={**(t.doc or {}), "label": lab}) for t, lab in zip(targets, req.labels, strict=True)]
    opt = EvalOptions(
        text=req.text or eval_text(),
        ctx=req.ctx,
        chunks=req.chunks,
        conf=req.confidence,
        seed=req.seed,
        timeout_s=req.timeout_s,
        launch_timeout_s=req.launch_timeout_s,
    )
    bars: dict[str, Progress | None] = {}

    def progress(label: str, done: int, total: int) -> None:
        if label not in bars:
            bars[label] = cb.progress_for(label) if cb.progress_for else None
        bar = bars[label]
        if bar is not None:
            bar("chunks", done, total or done)

    with ResultsDB.open(req.db_path) as db:
        ref, cands = evaluate(db, targets[0], targets[1:], opt, status=cb.status, progress=progress)
        db_name = str(db.path)
    return KldResult(reference=ref, candidates=cands, text=opt.text, ctx=req.ctx, confidence=req.confidence, db=db_name)


def qa(req: QualityRequest, cb: Callbacks | None = None) -> QaResult:
    """The multiple-choice soak: every question asked of each URL and each plan's server (launched
    in turn), each configuration paired with the first."""
    from moetune.bench.target import resolve
    from moetune.quality.qa import read_questions
    from moetune.quality.soak import SoakOptions, SoakRun, report, soak
    from moetune.store.db import ResultsDB

    assert req.qa is not None
    cb = cb or Callbacks()
    names = [*req.urls, *(str(p) for p in req.plans)]
    if not names:
        raise InputError(
            "--qa needs servers to ask: --url URL (repeatable) or plan files",
            hint="moetune quality --qa questions.jsonl --url http://127.0.0.1:8080",
        )
    if req.labels and len(req.labels) != len(names):
        raise InputError(f"{len(req.labels)} --label for {len(names)} configurations", hint="give one --label each")
    questions = read_questions(req.qa, req.qa_format)[: req.limit]
    opt = SoakOptions(
        thinking=req.thinking, max_tokens=req.max_tokens, model=req.model, timeout_s=req.timeout_s, conf=req.confidence
    )
    targets = [resolve(n, req.server if not n.startswith("http") else None) for n in names]
    runs: list[SoakRun] = []
    with ResultsDB.open(req.db_path) as db:
        for i, t in enumerate(targets):
            label = req.labels[i] if req.labels else (t.label or t.name)
            bar = cb.progress_for(label) if cb.progress_for else None

            def progress(done: int, total: int, bar: Progress | None = bar) -> None:
                if bar is not None:
                    bar("questions", done, total)

            details = {"question_file": str(req.qa), "format": req.qa_format}
            if t.url is not None:
                runs.append(
                    soak(db, t.url, questions, opt, label=label, target=t.name, details=details, progress=progress)
                )
                continue
            from moetune.bench.servers import launched

            with launched(t, timeout_s=req.launch_timeout_s, status=cb.status) as ln:
                runs.append(
                    soak(
                        db,
                        ln.url,
                        questions,
                        opt,
                        label=label,
                        target=t.name,
                        details=details,
                        meta={"plan": t.doc, "launch_run": ln.launch_run, "engine_build": ln.engine_build},
                        progress=progress,
                    )
                )
        db_name = str(db.path)
    return QaResult(report=report(runs, req.confidence), db=db_name)
