"""What `moetune doctor` reads: log files, captured responses, or a whole run directory.

A file is a server log, a worker log (by its banner) or responses (JSON: one chat completion, a
list of them, or one per line). A run id or directory gives every process's log with the
environment it ran with and the machine's RAM from the run record. ``latest`` is the newest
launch; a benchmark run of the results history (its id or label, as `compare` and `results`
take them) stands for the launch it measured (``RunMeta.launch_run``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from moetune.engine.logs import is_worker_log, parse_log, parse_worker_log, split_lines
from moetune.errors import InputError
from moetune.kinds import ProcessRole
from moetune.paths import default_db
from moetune.run.doctor import Finding, Response, Source, examine
from moetune.run.prepare import split_workers
from moetune.run.record import RunDir
from moetune.store.db import ResultsDB


def examine_inputs(args: Sequence[str], *, ram_mib: float | None = None, db_path: Path | None = None) -> list[Finding]:
    """`moetune doctor`: the findings in these log files, response captures, run directories or run references."""
    return examine(load_sources(args, db_path=db_path), ram_mib=ram_mib)


def load_sources(args: Sequence[str], *, db_path: Path | None = None) -> list[Source]:
    out: list[Source] = []
    for a in args:
        p = Path(a)
        if p.is_dir() and (p / "run.json").exists():
            out += run_sources(RunDir(p))
        elif p.is_file():
            out.append(file_source(p))
        elif "/" not in a:  # labels may hold dots: "q4.k, -ub 4096"
            out += run_sources(launch_of(a, db_path))
        else:
            raise InputError(f"{a}: no such file, run directory or run id")
    return out


def launch_of(ref: str, db_path: Path | None = None) -> RunDir:
    """The launch a reference names: a launch's run id, ``latest`` (the newest launch), or a
    benchmark run's id or label in the results history (the launch it measured)."""
    if ref == "latest":
        runs = RunDir.all()
        if not runs:
            raise InputError("no launched runs yet", hint="`moetune launch PLAN` starts one; or pass a log file")
        return max(runs, key=lambda r: r.info().created_at)
    db_file = db_path or default_db()
    unknown = InputError(
        f"{ref!r}: no such file, launch or benchmark run",
        hint="see `moetune ps --all` for launches, `moetune results list` for benchmark runs",
    )
    try:
        return RunDir.open(ref)
    except InputError:
        if not db_file.exists():
            raise unknown from None
    with ResultsDB.open(db_file) as db:
        try:
            run = db.resolve(ref)
        except InputError:
            raise unknown from None
    if run.meta.launch_run is None:
        raise InputError(
            f"benchmark run {run.id} ({run.label}) measured {run.target}, which moetune did not "
            "launch: there is no log of it to read",
            hint="pass the server's log file",
        )
    return RunDir.open(run.meta.launch_run)


def run_sources(rd: RunDir) -> list[Source]:
    ram_kib = rd.info().machine.get("ram_kib", "")
    ram = int(ram_kib) / 1024 if ram_kib.isdigit() else None
    found = {}
    for r in rd.procs():
        path = rd.log_path(r.name)
        if path.exists():
            src = file_source(path, env={**r.env_inherited, **r.env}, ram_mib=ram)
            found[r.name] = r, replace(src, name=f"{rd.run_id}/{r.name}", exit_code=r.exit_code)
    logs = {n: w for n, (_, src) in found.items() if (w := src.worker) is not None}
    out = []
    for r, src in found.values():
        if r.role != ProcessRole.RPC:
            mine, outside = split_workers(r.argv, rd.workers())
            src = replace(
                src,
                rpc_outside=tuple(outside),
                rpc_workers={ep: logs[n] for ep, n in mine.items() if n in logs},
            )
        out.append(src)
    return out


def file_source(path: Path, env: Mapping[str, str] | None = None, ram_mib: float | None = None) -> Source:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        docs = _json_docs(text)
        if docs is not None:
            responses, lines = responses_from(docs)
            return Source(
                name=str(path), responses=tuple(responses), response_lines=tuple(lines), env=env, ram_mib=ram_mib
            )
    lines = split_lines(text)
    if is_worker_log(lines):
        return Source(name=str(path), worker=parse_worker_log(text), env=env, ram_mib=ram_mib)
    return Source(name=str(path), server=parse_log(text), env=env, ram_mib=ram_mib)


def _json_docs(text: str) -> list[Any] | None:
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except json.JSONDecodeError:
        pass
    docs = []
    for line in text.splitlines():
        if line.strip():
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError:
                return None
    return docs


def responses_from(docs: Sequence[Any]) -> tuple[list[Response], list[str]]:
    """Chat completion responses (``choices[0].message``, ``usage``, ``timings``); one summary line each."""
    out: list[Response] = []
    lines: list[str] = []
    for doc in docs:
        if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list) or not doc["choices"]:
            continue
        msg = doc["choices"][0].get("message") or {}
        reasoning = str(msg.get("reasoning_content") or "")
        content = str(msg.get("content") or "")
        usage = doc.get("usage") or {}
        timings = doc.get("timings") or {}
        n = usage.get("completion_tokens", timings.get("predicted_n"))
        details = usage.get("completion_tokens_details") or {}
        rt = details.get("reasoning_tokens")
        out.append(
            Response(
                line=len(out) + 1,
                completion_tokens=int(n) if isinstance(n, int) else None,
                reasoning_chars=len(reasoning),
                content_chars=len(content),
                reasoning_tokens=int(rt) if isinstance(rt, int) else None,
            )
        )
        lines.append(
            f"response {len(out)}: completion_tokens={n}, reasoning_content {len(reasoning)} chars, "
            f"content {len(content)} chars"
        )
    return out, lines
