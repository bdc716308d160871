"""``moetune bench PLAN --sweep``: ik_llama.cpp's ``llama-sweep-bench`` as a benchmark backend.

llama-sweep-bench fills the context one ubatch at a time and, at each depth, times a ubatch of
prompt (PP) and ubatch/4 generated tokens (TG): the PP/TG-versus-depth curve the references' users
run. moetune runs it with the plan's own model and placement flags (its RPC workers started
first), keeps each row as a sample of a depth workload named like ``bench --depth`` names them
(``d0``, ``d512``, ...), so ``compare`` puts the two backends side by side. Parsing is pure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from moetune import __version__
from moetune.bench.analysis.summary import run_summary
from moetune.bench.server import model_ref
from moetune.bench.servers import model_arg, new_launch_id
from moetune.bench.single.workloads import DEPTH
from moetune.bench.target import Target
from moetune.engine.argv import SERVING_ALONE, SERVING_WITH_VALUE, strip_flags
from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.monitor.sampler import RunMonitor, Watch, watches_of_launch
from moetune.procfs import read_proc_stat
from moetune.run.process import end
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, RunMeta

# beyond serving, the flags sweep-bench sets itself: the context it sweeps, TG, output format, slots
_SWEEP_SETS = {"-c", "--ctx-size", "-n", "--n-predict", "--output-format", "--parallel", "-np"}

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepRow:
    pp: int  # prompt tokens timed at this depth (a ubatch)
    tg: int  # tokens generated at this depth
    n_kv: int  # the depth: tokens already in the cache
    t_pp_s: float
    t_tg_s: float

    @property
    def pp_tok_s(self) -> float:
        return self.pp / self.t_pp_s if self.t_pp_s > 0 else 0.0

    @property
    def tg_tok_s(self) -> float:
        return self.tg / self.t_tg_s if self.t_tg_s > 0 else 0.0


_MD_ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*[\d.]+\s*\|\s*([\d.]+)\s*\|")


def parse_row(line: str) -> SweepRow | None:
    """One result row of llama-sweep-bench's output, JSON lines (``--output-format jsonl``) or its
    markdown table; None for any other line."""
    s = line.strip()
    if s.startswith("{") and '"n_kv"' in s:
        try:
            d = json.loads(s)
            return SweepRow(
                pp=int(d["pp"]), tg=int(d["tg"]), n_kv=int(d["n_kv"]), t_pp_s=float(d["t_pp"]), t_tg_s=float(d["t_tg"])
            )
        except (ValueError, KeyError):
            return None
    m = _MD_ROW.match(s)
    if m:
        return SweepRow(pp=int(m[1]), tg=int(m[2]), n_kv=int(m[3]), t_pp_s=float(m[4]), t_tg_s=float(m[5]))
    return None


def parse_rows(text: str) -> list[SweepRow]:
    return [r for r in map(parse_row, text.splitlines()) if r is not None]


def row_sample(row: SweepRow, repeat: int) -> dict[str, object]:
    """A row as a depth sample: the server's ``timings`` shape, so every analysis reads it as it
    reads ``bench --depth`` (PP = prompt_n / prompt_ms, TG = predicted_n / predicted_ms)."""
    return {
        "workload": f"d{row.n_kv}",
        "kind": DEPTH,
        "depth": row.n_kv,
        "repeat": repeat,
        "thinking": None,
        "ignore_eos": True,
        "max_tokens": row.tg,
        "source": "llama-sweep-bench",
        "timings": {
            "prompt_n": row.pp,
            "prompt_ms": row.t_pp_s * 1000.0,
            "predicted_n": row.tg,
            "predicted_ms": row.t_tg_s * 1000.0,
        },
        "end_s": row.t_pp_s + row.t_tg_s,
    }


def sweep_argv(server_argv: Sequence[str], ctx: int, tg: int | None = None) -> list[str]:
    """The server's arguments as llama-sweep-bench's: same model, placement and cache; the context
    it sweeps; rows as JSON lines."""
    # --log-disable would silence its rows too (they go through the same log): it runs in a
    # directory of its own instead, where its llama.log goes
    out = strip_flags(server_argv, SERVING_WITH_VALUE | _SWEEP_SETS, SERVING_ALONE | {"--kv-unified", "--log-disable"})
    out += ["-c", str(ctx), "--output-format", "jsonl"]
    if tg is not None:
        out += ["-n", str(tg)]
    return out


def _flag(argv: Sequence[str], *names: str) -> str | None:
    for i, a in enumerate(argv[:-1]):
        if a in names:
            return argv[i + 1]
    return None


def tokens_per_depth(ub: int, tg: int | None) -> int:
    """What llama-sweep-bench generates at each depth: ``-n``, else its default of a quarter ubatch."""
    return tg or ub // 4


@dataclass(frozen=True, slots=True)
class SweepOptions:
    ctx: int | None = None  # the depth swept to (default: the plan's context)
    tg: int | None = None  # tokens generated per depth (default: the engine's, tokens_per_depth)
    repeats: int = 1  # runs of the whole sweep
    timeout_s: float = 3600.0


def bench_sweep(
    db: ResultsDB,
    t: Target,
    opt: SweepOptions,
    *,
    label: str | None = None,
    launch_timeout_s: float = 600.0,
    status: Callable[[str], None] | None = None,
    progress: Progress | None = None,
) -> int:
    """Run llama-sweep-bench with the plan's server flags (its RPC workers started first, stopped
    after); store each row as it comes. Returns the run's id."""
    from moetune.engine import registry
    from moetune.engine.launchspec import LaunchSpec

    if t.doc is None or t.spec is None or t.server is None:
        raise InputError(
            f"--sweep runs llama-sweep-bench from a plan's flags; {t.name} is a URL",
            hint="give the plan file (moetune plan ... -o plan.json)",
        )
    chosen = next(s for s in t.spec.servers() if s.name == t.server)
    engine = registry.get(chosen.engine)
    try:
        binary = engine.binary("sweep")
    except InputError:
        raise InputError(
            f"engine {engine.name} has no llama-sweep-bench (it comes with ik_llama.cpp)",
            hint="plan with --engine ik_llama.cpp (moetune engine install --kind ik_llama.cpp "
            "builds it), or register an ik_llama.cpp build that has it",
        ) from None
    plan_ctx = int(_flag(chosen.argv, "-c", "--ctx-size") or 4096)
    ctx = opt.ctx or plan_ctx
    ub = int(_flag(chosen.argv, "-ub", "--ubatch-size") or 512)
    if ctx < ub:
        raise InputError(f"--sweep-ctx {ctx} is below the ubatch ({ub}): nothing to sweep")
    argv = [str(binary), *sweep_argv(chosen.argv, ctx, opt.tg)]
    depths = len(range(0, ctx, ub))
    total = depths * opt.repeats
    meta = RunMeta(
        kind=RunKind.BENCH,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        model=model_ref(model_arg(chosen.argv)),
        host=HostRef.here(),
        engine_build=engine.version(),
        plan=t.doc,
        details={
            "backend": "llama-sweep-bench",
            "sweep_argv": argv,
            "ctx": ctx,
            "ubatch": ub,
            "repeats": opt.repeats,
            **_expected(t, chosen.name, ctx=ctx, ub=ub, tg=tokens_per_depth(ub, opt.tg)),
        },
    )
    run_id = db.create_run(meta, label=label or f"{t.label} (sweep-bench)", target=t.name)
    workers = LaunchSpec(tuple(t.spec.workers()))
    done = 0
    launch_id = new_launch_id()
    bench_proc: list[Watch] = []  # llama-sweep-bench itself, once started

    def watches() -> list[Watch]:
        return [*watches_of_launch(launch_id), *bench_proc]

    def started(pid: int) -> None:
        st = read_proc_stat(pid)
        bench_proc[:] = [
            Watch(name="llama-sweep-bench", role="server", pid=pid, start_ticks=st.start_ticks if st else None)
        ]

    try:
        with ExitStack() as stack:
            monitor = stack.enter_context(RunMonitor(watches, phase="sweep-bench"))
            monitor.attach(db, run_id)
            if workers.processes:  # RPC workers through `moetune launch`: stopped on leaving
                from moetune.run.launch import launched

                stack.enter_context(
                    launched(workers, t.doc, plan_file=t.name, timeout_s=launch_timeout_s, run_id=launch_id)
                )
                if status:
                    status(f"RPC workers up: {', '.join(p.name for p in workers.processes)}")
            stack.callback(monitor.close)  # its last sample before the workers stop
            for rep in range(opt.repeats):
                for row in _run(argv, opt.timeout_s, status, on_pid=started):
                    db.add_sample(run_id, row_sample(row, rep))
                    done += 1
                    if progress:
                        progress(f"depth {row.n_kv}", done, total)
    except KeyboardInterrupt:
        db.finish_run(run_id, RunStatus.INTERRUPTED, _summary(db, run_id))
        raise
    except MoetuneError as e:
        summary = _summary(db, run_id) or {}
        summary["error"] = str(e)
        db.finish_run(run_id, RunStatus.FAILED, summary)
        raise
    db.finish_run(run_id, RunStatus.DONE, run_summary(db.samples(run_id)))
    return run_id


def _expected(t: Target, service: str, *, ctx: int, ub: int, tg: int) -> dict[str, object]:
    """The plan's prediction at every depth the sweep measures (as bench's runs store it)."""
    from moetune.bench.analysis.predicted import expected
    from moetune.bench.single.runner import Launch
    from moetune.plan.speed import decode_context

    assert t.doc is not None
    launch = Launch(plan=t.doc, engine_build=None, model_path=None, launch_run="", service=service)
    predicted = launch.predicted()
    if predicted is None:
        return {}
    return {
        # each row generates its tokens at the depth, before its prompt (llama-sweep-bench's order)
        "predicted": expected(predicted, [(f"d{d}", d, ub, decode_context(d, 0, tg)) for d in range(0, ctx, ub)]),
        "prediction_uncertainty": launch.uncertainty(),
    }


def _summary(db: ResultsDB, run_id: int) -> dict[str, object] | None:
    samples = db.samples(run_id)
    return run_summary(samples) if samples else None


def _run(
    argv: list[str],
    timeout_s: float,
    status: Callable[[str], None] | None,
    on_pid: Callable[[int], None] = lambda pid: None,
) -> Iterator[SweepRow]:
    """Run llama-sweep-bench; yield its rows as they are printed; fail naming its last words."""
    if status:
        status("llama-sweep-bench: loading the model")
    scratch = tempfile.TemporaryDirectory(prefix="moetune-sweep-")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, cwd=scratch.name
    )
    on_pid(proc.pid)
    tail: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            row = parse_row(line)
            if row is not None:
                yield row
            else:
                tail = [*tail[-19:], line.rstrip()]
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"llama-sweep-bench ran past {timeout_s:.0f} s")
        rc = proc.wait()
    finally:
        end(proc)
        scratch.cleanup()
    if rc != 0:
        last = "\n".join(t for t in tail if t.strip())[-1500:]
        raise RuntimeFailure(f"llama-sweep-bench exited {rc}:\n{last}")
