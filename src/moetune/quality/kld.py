"""`moetune quality REFERENCE CANDIDATE...`: how far each candidate plan's token distributions are
from the reference plan's, teacher-forced on one evaluation text.

Each plan runs its engine's own ``llama-perplexity`` with the flags its server would get
(:func:`perplexity_argv`: the plan's rendered argv, minus the serving flags
:mod:`moetune.engine.argv` names, with the chunking set), its RPC workers started by the launcher
first and stopped after. The reference runs once in perplexity mode and saves its logits
(``--kl-divergence-base FILE``, beside the results database, recorded in the history by a key of its argv,
model file, text and engine); later candidates, in this command or another, reuse the file with
``--kl-divergence``. Each chunk's values are stored as a sample of a run of kind ``quality`` as the
engine prints them; the figures and intervals are :mod:`moetune.quality.stats`'.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from moetune import __version__
from moetune.bench.server import model_ref
from moetune.bench.servers import model_arg, new_launch_id
from moetune.bench.target import Target, flag_value
from moetune.engine.argv import SERVING_ALONE, SERVING_WITH_VALUE, strip_flags
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError, MoetuneError, RuntimeFailure
from moetune.kinds import RunKind, RunStatus
from moetune.quality import perplexity_output as po
from moetune.quality import stats
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, RunMeta

Status = Callable[[str], None]
Progress = Callable[[str, int, int], None]  # (label, chunks done, chunks in all)

# set by the evaluation itself, not taken from the plan: the chunk length, the batch (one chunk per
# decode: llama-perplexity needs -b to be below -c or a multiple of it), the sequences it derives
_SETS_ITSELF = frozenset(
    {"-c", "--ctx-size", "-b", "--batch-size", "--parallel", "-np", "--chunks", "-f", "--file", "--kl-divergence-base"}
)
_SETS_ITSELF_ALONE = frozenset({"--kl-divergence"})
UBATCH = ("-ub", "--ubatch-size")
DEFAULT_CTX = 256


def eval_text() -> Path:
    """The evaluation text shipped with moetune (written for the project, MIT like the code)."""
    return Path(str(resources.files("moetune.quality") / "data" / "eval.txt"))


@dataclass(frozen=True, slots=True, kw_only=True)
class EvalOptions:
    text: Path
    ctx: int = DEFAULT_CTX  # tokens per chunk (llama-perplexity -c); the second half of each is scored
    chunks: int | None = None  # at most this many chunks (default: all the text holds)
    conf: float = stats.DEFAULT_CONF
    seed: int = 0
    timeout_s: float = 3600.0
    launch_timeout_s: float = 600.0


def perplexity_argv(server_argv: Sequence[str], ctx: int, chunks: int | None = None) -> list[str]:
    """The server's arguments as llama-perplexity's: the same model, placement (-ot, --rpc, -ts,
    -ngl), cache types, -fa, threads and engine options; the serving flags dropped; the chunk
    length ``ctx``, one chunk per batch, the plan's ubatch where it fits in a chunk."""
    out = strip_flags(server_argv, SERVING_WITH_VALUE | _SETS_ITSELF, SERVING_ALONE | _SETS_ITSELF_ALONE)
    ub = flag_value(tuple(out), UBATCH)
    out = strip_flags(out, set(UBATCH), ())
    ubatch = min(int(ub), ctx) if ub and ub.isdigit() else ctx
    out += ["-c", str(ctx), "-b", str(ctx), "-ub", str(ubatch)]
    if chunks is not None:
        out += ["--chunks", str(chunks)]
    return out


def scored_per_chunk(ctx: int) -> int:
    """Tokens llama-perplexity scores in each chunk: the second half, less the last."""
    return ctx - 1 - ctx // 2


def base_size_bytes(n_vocab: int, ctx: int, n_chunk: int) -> int:
    """Size of a ``--kl-divergence-base`` file: a header, the tokens, and per scored token the
    log-probabilities as 16-bit values (two floats of scale in front), as perplexity.cpp writes it."""
    nv = 2 * ((n_vocab + 1) // 2) + 4
    return 8 + 4 + 4 + 4 + n_chunk * ctx * 4 + n_chunk * scored_per_chunk(ctx) * nv * 2


def base_key(argv: Sequence[str], model_stat: tuple[int, int] | None, text_sha: str, engine_version: str) -> str:
    doc = {"argv": list(argv), "model": model_stat, "text": text_sha, "engine": engine_version}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    plan: str
    label: str
    run_id: int
    kld: stats.Interval
    kld_p99: float | None  # None when the engine's summary was lost
    top1_agree: stats.Interval
    ppl: stats.Interval
    tokens: int
    verdict: str
    complete: bool  # the engine's summary came (else the figures are its last chunk's running values)

    def to_json(self) -> dict[str, object]:
        return {
            "plan": self.plan,
            "label": self.label,
            "run": self.run_id,
            "kld": {**self.kld.to_json(), "p99": self.kld_p99},
            "top1_agree": self.top1_agree.to_json(),
            "ppl": self.ppl.to_json(),
            "tokens": self.tokens,
            "verdict": self.verdict,
            "complete": self.complete,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Reference:
    plan: str
    label: str
    run_id: int | None
    ppl: stats.Interval | None
    tokens: int
    base_path: str
    base_size_bytes: int
    reused: bool  # the logits were saved by an earlier run

    def to_json(self) -> dict[str, object]:
        return {
            "plan": self.plan,
            "label": self.label,
            "run": self.run_id,
            "ppl": None if self.ppl is None else self.ppl.to_json(),
            "tokens": self.tokens,
            "logits": {"path": self.base_path, "size_bytes": self.base_size_bytes, "reused": self.reused},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    """A plan's server as llama-perplexity runs it."""

    target: Target
    server: ProcessSpec
    binary: Path
    argv: list[str]  # after the binary, without -f and the logits options
    engine_version: str
    label: str


def _prepare(t: Target, opt: EvalOptions) -> _Plan:
    from moetune.engine import registry

    if t.doc is None or t.spec is None or t.server is None:
        raise InputError(
            f"{t.name}: quality runs llama-perplexity with a plan's flags; give plan files",
            hint="moetune plan MODEL --hw HW -o plan.json (or `--qa FILE --url URL` for a server)",
        )
    chosen = next(s for s in t.spec.servers() if s.name == t.server)
    if chosen.ssh:
        raise InputError(
            f"{t.name}: server {chosen.name} runs on node {chosen.node} over ssh; quality runs "
            "llama-perplexity on this machine",
            hint="run `moetune quality` on that node",
        )
    engine = registry.get(chosen.engine)
    try:
        binary = engine.binary("perplexity")
    except InputError:
        raise InputError(
            f"engine {engine.name} has no llama-perplexity",
            hint="rebuild it (`moetune engine install`), or register a build that has it",
        ) from None
    return _Plan(
        target=t,
        server=chosen,
        binary=binary,
        argv=perplexity_argv(chosen.argv, opt.ctx, opt.chunks),
        engine_version=engine.version(),
        label=str(t.label or t.name),
    )


def _model_stat(argv: Sequence[str]) -> tuple[int, int] | None:
    m = model_arg(list(argv))
    try:
        st = os.stat(m) if m else None
    except OSError:
        return None
    return None if st is None else (st.st_size, st.st_mtime_ns)


def _n_vocab(argv: Sequence[str]) -> int | None:
    from moetune.model.profile import load_profile

    m = model_arg(list(argv))
    try:
        return load_profile(m).n_vocab if m and os.path.isfile(m) else None
    except MoetuneError:
        return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_text(path: Path, ctx: int) -> None:
    from moetune.paths import readable_file

    readable_file(path, "evaluation text")
    if path.stat().st_size < 2 * ctx:
        raise InputError(
            f"{path}: {path.stat().st_size} bytes cannot fill two chunks of {ctx} tokens",
            hint="give a longer --text, or a smaller --ctx",
        )


class _Runner:
    def __init__(self, db: ResultsDB, opt: EvalOptions, status: Status | None, progress: Progress | None) -> None:
        self.db, self.opt, self.status, self.progress = db, opt, status, progress
        self.text_sha = _sha256(opt.text)

    def say(self, s: str) -> None:
        if self.status:
            self.status(s)

    def meta(self, p: _Plan, argv: list[str], details: dict[str, object]) -> RunMeta:
        return RunMeta(
            kind=RunKind.QUALITY,
            moetune_version=__version__,
            argv=tuple(sys.argv),
            started_unix=time.time(),
            model=model_ref(model_arg(p.server.argv)),
            host=HostRef.here(),
            engine_build=p.engine_version,
            plan=p.target.doc,
            details={
                "perplexity_argv": argv,
                "ctx": self.opt.ctx,
                "chunks": self.opt.chunks,
                "scored_per_chunk": scored_per_chunk(self.opt.ctx),
                "text": {"path": str(self.opt.text), "sha256": self.text_sha},
                **details,
            },
        )

    def run_engine(self, p: _Plan, extra: list[str], on_line: Callable[[str], None], run_id: int) -> str:
        """Run llama-perplexity for a plan (its RPC workers up first); return its whole output."""
        argv = [str(p.binary), *p.argv, "-f", str(self.opt.text), *extra]
        t = p.target
        assert t.spec is not None and t.doc is not None
        workers = LaunchSpec(tuple(t.spec.workers()))
        with ExitStack() as stack:
            if workers.processes:
                from moetune.run.launch import launched

                stack.enter_context(
                    launched(
                        workers, t.doc, plan_file=t.name, timeout_s=self.opt.launch_timeout_s, run_id=new_launch_id()
                    )
                )
                self.say(f"{p.label}: RPC workers up: {', '.join(w.name for w in workers.processes)}")
            return _run(argv, {**os.environ, **p.server.env}, self.opt.timeout_s, on_line)

    def _reused(self, p: _Plan, key: str) -> Reference | None:
        """The reference logits an earlier run saved under ``key``, if their file is still whole."""
        known = self.db.kld_base(key)
        if known is None or not known[0].is_file() or known[0].stat().st_size != known[1]:
            return None
        path, size, rid = known
        ppl = None
        tokens = 0
        if rid is not None:
            r = self.db.run(rid)
            s = r.summary or {}
            ppl = _interval_of(s.get("ppl"))
            tokens = int(s.get("tokens") or 0)
        self.say(f"reference logits reused: {path} ({size / 2**20:.1f} MiB)")
        return Reference(
            plan=p.target.name,
            label=p.label,
            run_id=rid,
            ppl=ppl,
            tokens=tokens,
            base_path=str(path),
            base_size_bytes=size,
            reused=True,
        )

    def reference(self, p: _Plan) -> Reference:
        key = base_key(p.argv, _model_stat(p.server.argv), self.text_sha, p.engine_version)
        if (reused := self._reused(p, key)) is not None:
            return reused
        path = self.db.path.parent.resolve() / "quality-logits" / f"{key}.kld"  # beside the history that records it
        path.parent.mkdir(parents=True, exist_ok=True)
        n_vocab = _n_vocab(p.server.argv)
        if n_vocab is not None:  # a token is at least a byte: the text's size bounds the chunks
            most = self.opt.text.stat().st_size // self.opt.ctx
            most = min(most, self.opt.chunks) if self.opt.chunks else most
            bound = base_size_bytes(n_vocab, self.opt.ctx, most)
            free = shutil.disk_usage(path.parent).free
            self.say(
                f"reference logits: at most {bound / 2**20:.1f} MiB ({n_vocab} tokens of vocabulary, "
                f"up to {most} chunks) -> {path}"
            )
            if bound > free:
                raise InputError(
                    f"the reference logits need up to {bound / 2**20:.0f} MiB; {path.parent} has "
                    f"{free / 2**20:.0f} MiB free",
                    hint="free space there, set MOETUNE_CACHE_DIR elsewhere, or lower --chunks",
                )
        extra = ["--kl-divergence-base", str(path)]
        run_id = self.db.create_run(
            self.meta(p, [str(p.binary), *p.argv, *extra], {"role": "reference"}),
            label=f"{p.label} (reference)",
            target=p.target.name,
        )
        seen: list[int] = []
        total = [0]

        def on_line(line: str) -> None:
            announced = po.announced_chunks(line)
            if announced is not None and n_vocab:
                exact = base_size_bytes(n_vocab, self.opt.ctx, announced)
                self.say(f"reference logits: writing {exact / 2**20:.1f} MiB ({announced} chunks)")
            if announced is not None:
                total[0] = announced
            seen.extend(po.running_ppl_chunks(line))
            if seen and self.progress:
                self.progress(f"{p.label} (reference)", len(seen), total[0])

        try:
            text = self.run_engine(p, extra, on_line, run_id)
            out = po.parse_ppl(text)
            if not out.running:
                raise RuntimeFailure(f"llama-perplexity printed no perplexity for {p.label}:\n{_tail(text)}")
            nll = stats.per_chunk_ppl(out.running)
            for k, v in enumerate(nll, start=1):
                self.db.add_sample(
                    run_id, {"chunk": k, "ppl": math.exp(v), "nll": v, "running_ppl": out.running[k - 1]}
                )
            ppl_val, ppl_unc = out.final or (out.running[-1], float("nan"))
            ppl = stats.ppl_interval(ppl_val, ppl_unc, out.running, conf=self.opt.conf, seed=self.opt.seed)
            tokens = len(out.running) * scored_per_chunk(self.opt.ctx)
            size = path.stat().st_size
            self.db.finish_run(
                run_id,
                RunStatus.DONE,
                {"ppl": ppl.to_json(), "tokens": tokens, "logits": {"path": str(path), "size_bytes": size}},
            )
            self.db.put_kld_base(key, path, size, run_id)
        except BaseException as e:
            path.unlink(missing_ok=True)
            self.db.finish_run(
                run_id,
                RunStatus.INTERRUPTED if isinstance(e, KeyboardInterrupt) else RunStatus.FAILED,
                {"error": str(e)},
            )
            raise
        self.say(f"reference logits saved: {path} ({size / 2**20:.1f} MiB)")
        return Reference(
            plan=p.target.name,
            label=p.label,
            run_id=run_id,
            ppl=ppl,
            tokens=tokens,
            base_path=str(path),
            base_size_bytes=size,
            reused=False,
        )

    def candidate(self, p: _Plan, ref: Reference) -> Candidate:
        extra = ["--kl-divergence-base", ref.base_path, "--kl-divergence"]
        run_id = self.db.create_run(
            self.meta(p, [str(p.binary), *p.argv, *extra], {"role": "candidate", "reference": ref.to_json()}),
            label=p.label,
            target=p.target.name,
        )
        try:
            out = self._kld(p, extra, run_id)
            c = _candidate(p, out, run_id, self.opt)
            self.db.finish_run(run_id, RunStatus.DONE, c.to_json())
            return c
        except BaseException as e:
            self.db.finish_run(
                run_id,
                RunStatus.INTERRUPTED if isinstance(e, KeyboardInterrupt) else RunStatus.FAILED,
                {"error": str(e)},
            )
            raise

    def _kld(self, p: _Plan, extra: list[str], run_id: int) -> po.KldOutput:
        """The KLD run; once more when the engine's summary was lost at its exit (llama.cpp #22142)."""
        out: po.KldOutput | None = None
        for attempt in range(2):
            rows, total = 0, 0

            def on_line(line: str) -> None:
                nonlocal rows, total
                total = po.announced_chunks(line) or total
                if po.parse_row(line) is not None:
                    rows += 1
                    if self.progress:
                        self.progress(p.label, rows, total)

            text = self.run_engine(p, extra, on_line, run_id)
            out = po.parse_kld(text)
            if not out.rows:
                raise RuntimeFailure(f"llama-perplexity printed no KL divergence for {p.label}:\n{_tail(text)}")
            if out.complete:
                break
            if attempt == 0:
                self.say(f"{p.label}: the engine's summary was lost at its exit (llama.cpp #22142); running again")
        assert out is not None
        kld = stats.per_chunk([r.kld for r in out.rows])
        top = stats.per_chunk([r.same_top for r in out.rows])
        nll = stats.per_chunk([math.log(r.ppl) for r in out.rows])
        for i, r in enumerate(out.rows):
            self.db.add_sample(
                run_id,
                {
                    "chunk": r.chunk,
                    "kld": kld[i],
                    "top1_agree": top[i],
                    "ppl": math.exp(nll[i]),
                    "running": {"kld": r.kld, "same_top": r.same_top, "ppl": r.ppl},
                },
            )
        return out


def _interval_of(d: Any) -> stats.Interval | None:
    if not isinstance(d, dict):
        return None
    return stats.Interval(
        mean=float(d["mean"]),
        ci_low=float(d["ci_low"]),
        ci_high=float(d["ci_high"]),
        method=str(d["method"]),
        n=int(d.get("n_chunks") or 0),
    )


def _candidate(p: _Plan, out: po.KldOutput, run_id: int, opt: EvalOptions) -> Candidate:
    """The figures of a KLD run: the summary's where it came, else the last row's running values."""
    rows, s = out.rows, out.summary
    last = rows[-1]
    kld_chunks = stats.per_chunk([r.kld for r in rows])
    top_chunks = stats.per_chunk([r.same_top for r in rows])
    kld = stats.interval(
        s.kld if s else last.kld, s.kld_unc if s else last.kld_unc, kld_chunks, conf=opt.conf, seed=opt.seed
    )
    # a divergence is never negative: below zero is the rounding of the printed running means
    kld = stats.Interval(
        mean=kld.mean, ci_low=max(kld.ci_low, min(kld.mean, 0.0)), ci_high=kld.ci_high, method=kld.method, n=kld.n
    )
    top = stats.interval(
        s.same_top if s else last.same_top,
        s.same_top_unc if s else last.same_top_unc,
        top_chunks,
        conf=opt.conf,
        seed=opt.seed,
    )
    top = stats.Interval(
        mean=top.mean, ci_low=max(0.0, top.ci_low), ci_high=min(1.0, top.ci_high), method=top.method, n=top.n
    )
    ppl = stats.ppl_interval(
        s.ppl_q if s else last.ppl,
        s.ppl_q_unc if s else last.ppl_unc,
        [r.ppl for r in rows],
        conf=opt.conf,
        seed=opt.seed,
    )
    return Candidate(
        plan=p.target.name,
        label=p.label,
        run_id=run_id,
        kld=kld,
        kld_p99=s.kld_percentiles.get("99.0") if s else None,
        top1_agree=top,
        ppl=ppl,
        tokens=len(rows) * scored_per_chunk(opt.ctx),
        verdict=stats.kld_verdict(kld),
        complete=s is not None,
    )


def evaluate(
    db: ResultsDB,
    reference: Target,
    candidates: Sequence[Target],
    opt: EvalOptions,
    *,
    status: Status | None = None,
    progress: Progress | None = None,
) -> tuple[Reference, list[Candidate]]:
    """The reference's logits (saved, or reused), then each candidate against them, in order."""
    check_text(opt.text, opt.ctx)
    plans = [_prepare(t, opt) for t in [reference, *candidates]]
    r = _Runner(db, opt, status, progress)
    ref = r.reference(plans[0])
    return ref, [r.candidate(p, ref) for p in plans[1:]]


def _tail(text: str) -> str:
    return "\n".join(x for x in text.splitlines()[-20:] if x.strip())[-1500:]


def _run(argv: list[str], env: dict[str, str], timeout_s: float, on_line: Callable[[str], None]) -> str:
    """Run llama-perplexity in a scratch directory; feed each line to ``on_line``; its output, or
    a failure that names its last words."""
    scratch = tempfile.TemporaryDirectory(prefix="moetune-ppl-")
    lines: list[str] = []
    from moetune.run.process import end

    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        cwd=scratch.name,
        env=env,
        errors="replace",
    )
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            on_line(line)
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"llama-perplexity ran past {timeout_s:.0f} s")
        rc = proc.wait()
    finally:
        end(proc)
        scratch.cleanup()
    text = "".join(lines)
    short = po.too_short(text)
    if short is not None:
        raise InputError(
            f"the evaluation text holds {short.have or 'too few'} tokens; two chunks of {short.ctx} need {short.need}",
            hint="give a longer --text, or a smaller --ctx",
        )
    if rc != 0:
        raise RuntimeFailure(f"llama-perplexity exited {rc}:\n{_tail(text)}")
    return text
