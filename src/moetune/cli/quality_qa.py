"""`moetune quality --qa FILE`: the multiple-choice soak, against URLs or plans launched in turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from moetune.cli.common import err, out, print_json, print_wide
from moetune.errors import InputError


def run_qa(
    qa_path: Path,
    fmt: str,
    plans: tuple[Path, ...],
    urls: tuple[str, ...],
    labels: tuple[str, ...],
    *,
    limit: int | None,
    thinking: str,
    max_tokens: int,
    model: str | None,
    server: str | None,
    launch_timeout_s: float,
    timeout_s: float,
    confidence: float,
    db_path: Path | None,
    as_json: bool,
) -> None:
    from moetune.bench.target import resolve
    from moetune.cli.progress import progress_bar
    from moetune.quality.qa import read_questions
    from moetune.quality.soak import SoakOptions, SoakRun, report, soak
    from moetune.report.quality_view import soak_table
    from moetune.store.db import ResultsDB

    names = [*urls, *(str(p) for p in plans)]
    if not names:
        raise InputError(
            "--qa needs servers to ask: --url URL (repeatable) or plan files",
            hint="moetune quality --qa questions.jsonl --url http://127.0.0.1:8080",
        )
    if labels and len(labels) != len(names):
        raise InputError(f"{len(labels)} --label for {len(names)} configurations", hint="give one --label each")
    questions = read_questions(qa_path, fmt)[:limit]
    opt = SoakOptions(thinking=thinking, max_tokens=max_tokens, model=model, timeout_s=timeout_s, conf=confidence)
    targets = [resolve(n, server if not n.startswith("http") else None) for n in names]
    runs: list[SoakRun] = []
    with ResultsDB.open(db_path) as db, progress_bar(not as_json) as bars:
        for i, t in enumerate(targets):
            label = labels[i] if labels else (t.label or t.name)
            cb = bars(label)

            def progress(done: int, total: int, cb: Any = cb) -> None:
                cb("questions", done, total)

            details = {"question_file": str(qa_path), "format": fmt}
            if t.url is not None:
                runs.append(
                    soak(db, t.url, questions, opt, label=label, target=t.name, details=details, progress=progress)
                )
                continue
            from moetune.bench.servers import launched

            with launched(t, timeout_s=launch_timeout_s, status=lambda s: err.print(f"[dim]{s}[/]")) as ln:
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
    rep = report(runs, confidence)
    if as_json:
        print_json({**rep.to_json(), "db": db_name})
        return
    print_wide(soak_table(rep))
    out.print(f"runs stored in {db_name}")
