"""Priors from published measurements: a table of single-stream TG/PP runs of MoE models with
CPU-resident experts on other people's rigs, shipped with moetune (``published.yaml`` beside this
module), and the speed model fitted to it.

Each row is one published measurement: its source, the rig's hardware, the engine, the model (one of
moetune's presets, with a quant recipe approximating the published file), the command (as a moetune
strategy and settings) and the measured tok/s. :func:`row_work` turns a row into the speed model's
:class:`~moetune.plan.speed.Work` (the same :func:`~moetune.plan.speed.work` a plan uses), so a row is
an :class:`~moetune.plan.calibrate.Observation` for the same :func:`~moetune.plan.calibrate.fit` that
``moetune calibrate`` runs. :func:`leave_one_rig_out` says how well the fit carries to a machine it did
not see: each rig predicted by a fit on the other rigs' rows, the references' rows
(``reference: true``) held out of every fit.

Pure: the table's document in (the file is read by :func:`moetune.planfiles.published_priors`),
dataclasses and constants out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from moetune.errors import InputError
from moetune.hardware.inventory import Device, Inventory, Node
from moetune.kinds import DeviceKind, EngineKind, StrategyKind
from moetune.model.archs import PRESET_RECIPES, PRESETS
from moetune.model.kv import CACHE_TYPES
from moetune.model.profile import ModelProfile
from moetune.plan.calibrate import Observation, fit, predict_pp, predict_tg
from moetune.plan.placement import parse_strategy
from moetune.plan.plan import place
from moetune.plan.settings import Settings
from moetune.plan.speed import SpeedConstants, Work, work

TABLE_FILE = "published.yaml"
ENGINES = {"llama.cpp": EngineKind.MAINLINE, "ik_llama.cpp": EngineKind.IK}
MIN_ROWS = 12
MIN_RIGS = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class Gpu:
    name: str
    mem_mib: float
    bw_gbs: float  # the card's memory bandwidth (its specification unless the source measured it)
    link_gbs: float  # to the host (PCIe)
    tflops: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    gib: float
    kind: str  # DDR5-6400, or "DDR5-6000 at 4800" where the DIMMs run slower than rated
    channels: int
    mts: int  # the speed they run at (MT/s)
    bw_gbs: float  # what the speed model is given: the theoretical peak, channels x MT/s x 8 bytes
    measured_gbs: float | None = None  # what the source measured, where it did (not used: said for comparison)


@dataclass(frozen=True, slots=True, kw_only=True)
class Rig:
    id: str
    cpu: str
    cores: int
    memory: Memory
    gpus: tuple[Gpu, ...] = ()
    os: str = ""
    note: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published measurement and the command that made it."""

    id: str
    rig: str
    source: str  # the page the numbers were read in
    engine: str  # llama.cpp | ik_llama.cpp
    tool: str  # llama-server, llama-bench, llama-sweep-bench
    model: str  # as published: DeepSeek-R1, GLM-5.1
    preset: str  # the moetune preset with its shape (moetune.model.archs.PRESETS)
    quant: str  # as published
    command: str
    placement: str  # the command's expert placement as a moetune strategy
    gpus_used: int  # the rig's first N GPUs run it
    threads: int
    tg_tok_s: float
    depth: int = 0  # context depth of the TG measurement
    recipe: str | None = None  # a quant recipe approximating the file (None: the preset's own)
    model_size_gib: float | None = None  # the published file's size, where given
    copy: str | None = None  # where a copy of the page is kept (a repository's file)
    reference: bool = False  # the references' rows: held out of every fit
    fit: bool = True  # False: kept in the table and reported, left out of every fit (``note`` says why)
    threads_batch: int | None = None
    ctx: int = 4096
    batch: int = 2048
    ubatch: int = 512
    ctk: str = "f16"
    ctv: str = "f16"
    flash_attn: bool = True
    repack: bool = False  # CPU weights repacked: ik's -rtr or a pre-repacked _R4 file
    mla: int = 3
    merge_up_gate: bool = False
    merge_qkv: bool = False
    grouped_experts: bool = False
    pp_tok_s: float | None = None
    pp_tokens: int | None = None  # the PP measurement's prompt (None: one ubatch)
    note: str = ""

    @property
    def engine_kind(self) -> EngineKind:
        return ENGINES[self.engine]

    @property
    def quant_recipe(self) -> str:
        return self.recipe or PRESET_RECIPES[self.preset]


@dataclass(frozen=True, slots=True, kw_only=True)
class Table:
    rigs: tuple[Rig, ...]
    rows: tuple[Row, ...]

    def rig(self, rig_id: str) -> Rig:
        return next(r for r in self.rigs if r.id == rig_id)


# --- reading the document -------------------------------------------------------------------


def _fail(where: str, what: str, hint: str | None = None) -> InputError:
    return InputError(f"{where}: {what}", hint=hint)


def _keys(doc: Any, where: str, cls: type, required: Iterable[str]) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise _fail(where, f"expected a mapping, got {type(doc).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise _fail(where, f"unknown key {unknown[0]!r}", hint=f"known keys: {', '.join(sorted(known))}")
    missing = [k for k in required if doc.get(k) in (None, "")]
    if missing:
        raise _fail(where, f"{missing[0]!r} is required")
    return dict(doc)


def _number(v: Any, where: str, name: str, *, integer: bool = False, minimum: float = 0.0, strict: bool = True) -> Any:
    ok = isinstance(v, int) if integer else isinstance(v, int | float)
    if isinstance(v, bool) or not ok or not math.isfinite(v) or (v <= minimum if strict else v < minimum):
        kind = "an integer" if integer else "a number"
        bound = f"above {minimum:g}" if strict else f"at least {minimum:g}"
        raise _fail(where, f"{name} {v!r}: must be {kind} {bound}")
    return v


def _gpu(doc: Any, where: str) -> Gpu:
    d = _keys(doc, where, Gpu, ("name", "mem_mib", "bw_gbs", "link_gbs"))
    for k in ("mem_mib", "bw_gbs", "link_gbs"):
        _number(d[k], where, k)
    if d.get("tflops") is not None:
        _number(d["tflops"], where, "tflops")
    return Gpu(**d)


def _memory(doc: Any, where: str) -> Memory:
    d = _keys(doc, where, Memory, ("gib", "kind", "channels", "mts", "bw_gbs"))
    for k in ("gib", "bw_gbs"):
        _number(d[k], where, k)
    for k in ("channels", "mts"):
        _number(d[k], where, k, integer=True)
    peak = d["channels"] * d["mts"] * 8 / 1000
    if abs(d["bw_gbs"] - peak) > 0.01 * peak:
        raise _fail(
            where,
            f"bw_gbs {d['bw_gbs']:g}: the table gives the peak, channels x MT/s x 8 bytes = {peak:g}",
            hint="a measured figure goes in measured_gbs",
        )
    if d.get("measured_gbs") is not None:
        _number(d["measured_gbs"], where, "measured_gbs")
    return Memory(**d)


def _rig(doc: Any, where: str) -> Rig:
    d = _keys(doc, where, Rig, ("id", "cpu", "cores", "memory"))
    _number(d["cores"], where, "cores", integer=True)
    gpus = d.get("gpus") or []
    if not isinstance(gpus, list):
        raise _fail(where, "gpus: expected a list")
    return Rig(
        **{
            **d,
            "memory": _memory(d["memory"], f"{where}.memory"),
            "gpus": tuple(_gpu(g, f"{where}.gpus[{i}]") for i, g in enumerate(gpus)),
        }
    )


BOOL_FIELDS = ("reference", "fit", "flash_attn", "repack", "merge_up_gate", "merge_qkv", "grouped_experts")
REQUIRED_ROW = (
    "id",
    "rig",
    "source",
    "engine",
    "tool",
    "model",
    "preset",
    "quant",
    "command",
    "placement",
    "threads",
    "tg_tok_s",
)


def _row(doc: Any, where: str, rigs: Mapping[str, Rig]) -> Row:
    d = _keys(doc, where, Row, REQUIRED_ROW)
    if "gpus_used" not in d:
        raise _fail(where, "'gpus_used' is required", hint="0 for a CPU-only run")
    where = f"{where} ({d['id']})"
    if not str(d["source"]).startswith(("https://", "http://")):
        raise _fail(where, f"source {d['source']!r}: a URL of the page the numbers were read in")
    if d["rig"] not in rigs:
        raise _fail(where, f"rig {d['rig']!r} is not among the rigs ({', '.join(rigs)})")
    if d["engine"] not in ENGINES:
        raise _fail(where, f"engine {d['engine']!r}: choose {' or '.join(ENGINES)}")
    if d["preset"] not in PRESETS:
        raise _fail(where, f"preset {d['preset']!r}: not a moetune preset", hint=f"presets: {', '.join(PRESETS)}")
    strategy = parse_strategy(str(d["placement"]), f"{where}: placement")
    if strategy.kind == StrategyKind.AUTO:
        raise _fail(where, "placement auto: give the command's placement (cpu-moe, n-cpu-moe:N, layers:...)")
    rig = rigs[d["rig"]]
    used = _number(d["gpus_used"], where, "gpus_used", integer=True, strict=False)
    if used > len(rig.gpus):
        raise _fail(where, f"gpus_used {used}: rig {rig.id} has {len(rig.gpus)} GPUs")
    _number(d["threads"], where, "threads", integer=True)
    _number(d["tg_tok_s"], where, "tg_tok_s")
    for k in ("threads_batch", "pp_tokens", "ctx", "batch", "ubatch"):
        if d.get(k) is not None:
            _number(d[k], where, k, integer=True)
    for k in ("pp_tok_s", "model_size_gib"):
        if d.get(k) is not None:
            _number(d[k], where, k)
    _number(d.get("depth", 0), where, "depth", integer=True, strict=False)
    for k in ("ctk", "ctv"):
        if d.get(k, "f16") not in CACHE_TYPES:
            raise _fail(where, f"{k} {d[k]!r}: choose one of {', '.join(CACHE_TYPES)}")
    for k in ("command", "note", "quant", "model", "tool"):
        if k in d and not isinstance(d[k], str):
            raise _fail(where, f"{k}: expected text")
    for k in BOOL_FIELDS:
        if k in d and not isinstance(d[k], bool):
            raise _fail(where, f"{k} {d[k]!r}: expected true or false")
    return Row(**d)


def parse_table(doc: Any, source: str) -> Table:
    """The table a document holds, every row checked: a URL, a known rig, engine and preset, a
    placement moetune can plan, positive measurements. InputError names the first problem."""
    if not isinstance(doc, dict) or doc.get("version") != 1:
        raise _fail(source, "not a table of published measurements (expected version: 1, rigs and rows)")
    rigs_doc, rows_doc = doc.get("rigs"), doc.get("rows")
    if not isinstance(rigs_doc, list) or not isinstance(rows_doc, list):
        raise _fail(source, "rigs and rows must be lists")
    rigs: dict[str, Rig] = {}
    for i, r in enumerate(rigs_doc):
        rig = _rig(r, f"{source}: rigs[{i}]")
        if rig.id in rigs:
            raise _fail(f"{source}: rigs[{i}]", f"id {rig.id!r} is used twice")
        rigs[rig.id] = rig
    rows: list[Row] = []
    for i, r in enumerate(rows_doc):
        row = _row(r, f"{source}: rows[{i}]", rigs)
        if any(x.id == row.id for x in rows):
            raise _fail(f"{source}: rows[{i}]", f"id {row.id!r} is used twice")
        rows.append(row)
    return Table(rigs=tuple(rigs.values()), rows=tuple(rows))


# --- a row as the speed model's work ---------------------------------------------------------


def rig_inventory(rig: Rig, gpus_used: int) -> Inventory:
    """The rig as a hardware file would say it, with the GPUs the command ran on (its first
    ``gpus_used``: CUDA0, CUDA1, ...)."""
    mib = 1024.0
    devs = tuple(
        Device(
            name=f"CUDA{i}",
            kind=DeviceKind.GPU,
            mem_mib=g.mem_mib,
            bw_gbs=g.bw_gbs,
            node="local",
            link_gbs=g.link_gbs,
            tflops=g.tflops,
        )
        for i, g in enumerate(rig.gpus[:gpus_used])
    )
    node = Node(name="local", cores=rig.cores, ram_mib=rig.memory.gib * mib, ram_bw_gbs=rig.memory.bw_gbs, devices=devs)
    return Inventory((node,), name=rig.id)


def row_settings(row: Row) -> Settings:
    return Settings(
        ctx=row.ctx,
        batch=row.batch,
        ubatch=min(row.ubatch, row.batch),
        ctk=row.ctk,
        ctv=row.ctv,
        flash_attn=row.flash_attn,
        engine=row.engine_kind,
        repack=row.repack,
        threads=row.threads,
        threads_batch=row.threads_batch,
        mla=row.mla,
        merge_up_gate=row.merge_up_gate,
        merge_qkv=row.merge_qkv,
        grouped_experts=row.grouped_experts,
    )


def row_work(row: Row, rig: Rig, profile: ModelProfile) -> Work:
    """What the row's command asks of the rig, by the same placement and work a plan uses."""
    hw = rig_inventory(rig, row.gpus_used)
    s = row_settings(row)
    return work(profile, hw, place(row.placement, profile, hw, s, reserved={}, margins={}), s)


def observation(index: int, row: Row, w: Work) -> Observation:
    return Observation(
        run=index,
        work=w,
        depth=row.depth,
        measured_tg=row.tg_tok_s,
        measured_pp=row.pp_tok_s,
        prompt_tokens=row.pp_tokens,
    )


# --- fitting and the leave-one-rig-out error ---------------------------------------------------


# The speed model's guesses before the published table (the defaults of SpeedConstants until it):
# the fit starts from them and is pulled toward them, so the shipped constants are reproducible from
# the table (benchmarks/bench_priors.py refits them).
GUESSES = replace(
    SpeedConstants(),
    gpu_bw_eff=0.75,
    cpu_bw_eff=0.55,
    cpu_core_gbs=10.0,
    split_us=25.0,
    token_overhead_us=300.0,
    gpu_tflops=80.0,
    cpu_gflops_per_core=40.0,
    ik_cpu_gflops_per_core=40.0,
    ubatch_overhead_us=2000.0,
)
# The constants the published rows see and the shipped defaults take from their fit: memory
# efficiencies, per-thread rates and fixed costs. The rest (RPC hops, attention over the context,
# repacking, flash attention and quantized-cache factors) are left to the testbed's measurements:
# these rows have no RPC device and are measured at depth 0.
ADOPTED = (
    "gpu_bw_eff",
    "cpu_bw_eff",
    "cpu_core_gbs",
    "token_overhead_us",
    "gpu_tflops",
    "ik_cpu_gflops_per_core",
    "ubatch_overhead_us",
)


def fit_rows(obs: list[Observation], prior: SpeedConstants = GUESSES) -> SpeedConstants:
    """The constants fitted to published rows by ``moetune calibrate``'s fit, moving only the
    :data:`ADOPTED` ones (the rest stay at the prior's)."""
    return fit(obs, prior, names=ADOPTED)


def fitted(row: Row) -> bool:
    """Whether a row enters the fits: not a reference row, not marked ``fit: false``."""
    return row.fit and not row.reference


@dataclass(frozen=True, slots=True, kw_only=True)
class Predicted:
    row: str
    rig: str
    reference: bool
    measured_tg: float
    measured_pp: float | None
    tg: float  # by the constants in question
    pp: float | None

    @property
    def tg_err_pct(self) -> float:
        return (self.tg - self.measured_tg) / self.measured_tg * 100.0

    @property
    def pp_err_pct(self) -> float | None:
        if self.measured_pp is None or self.pp is None:
            return None
        return (self.pp - self.measured_pp) / self.measured_pp * 100.0


def predicted(rows: list[Row], obs: list[Observation], k: SpeedConstants) -> list[Predicted]:
    return [
        Predicted(
            row=r.id,
            rig=r.rig,
            reference=r.reference,
            measured_tg=r.tg_tok_s,
            measured_pp=r.pp_tok_s,
            tg=predict_tg(o, k),
            pp=predict_pp(o, k) if r.pp_tok_s else None,
        )
        for r, o in zip(rows, obs, strict=True)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class RigOut:
    rig: str
    fitted_on: tuple[str, ...]  # the rigs whose rows the fit saw
    constants: SpeedConstants
    predictions: tuple[Predicted, ...] = field(default=())


def leave_one_rig_out(rows: list[Row], obs: list[Observation], prior: SpeedConstants = GUESSES) -> list[RigOut]:
    """Each rig's rows predicted by a fit on the other rigs' rows; the references' rows (and rows
    marked ``fit: false``) are in no fit (the references' rig, where it has no other rows, is
    predicted by the fit on every other row: the shipped constants' own test)."""
    rigs = list(dict.fromkeys(r.rig for r in rows))
    out = []
    for rig in rigs:
        train = [(r, o) for r, o in zip(rows, obs, strict=True) if r.rig != rig and fitted(r)]
        k = fit_rows([o for _, o in train], prior)
        held = [(r, o) for r, o in zip(rows, obs, strict=True) if r.rig == rig]
        out.append(
            RigOut(
                rig=rig,
                fitted_on=tuple(dict.fromkeys(r.rig for r, _ in train)),
                constants=k,
                predictions=tuple(predicted([r for r, _ in held], [o for _, o in held], k)),
            )
        )
    return out


def median_abs(xs: Iterable[float | None]) -> float | None:
    vals = sorted(abs(x) for x in xs if x is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def observations(table: Table, profiles: Mapping[tuple[str, str], ModelProfile]) -> list[Observation]:
    """Every row as an observation (run = its index), its model the profile of ``(preset, recipe)``."""
    return [
        observation(i, r, row_work(r, table.rig(r.rig), profiles[(r.preset, r.quant_recipe)]))
        for i, r in enumerate(table.rows)
    ]


@dataclass(frozen=True, slots=True, kw_only=True)
class Errors:
    """Median absolute errors (percent) of a set of predictions, TG and PP."""

    tg: float | None
    pp: float | None
    rows: int

    @classmethod
    def of(cls, ps: Iterable[Predicted]) -> Errors:
        ps = list(ps)
        return cls(tg=median_abs(p.tg_err_pct for p in ps), pp=median_abs(p.pp_err_pct for p in ps), rows=len(ps))


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """The table against the speed model: the guesses before it, the shipped constants, the fit
    that makes them (from the guesses, on every fitted row) and each rig left out."""

    rows: tuple[Row, ...]
    guessed: tuple[Predicted, ...]  # by GUESSES
    shipped: tuple[Predicted, ...]  # by SpeedConstants()
    refit: SpeedConstants  # fit_rows(every fitted row): what the shipped constants were rounded from
    held_out: tuple[Predicted, ...]  # each row by the fit that did not see its rig
    rig_outs: tuple[RigOut, ...]

    def errors(self, which: str, *, reference: bool) -> Errors:
        """``which``: guessed | shipped | held_out; over the references' rows, or the fitted ones."""
        ps: tuple[Predicted, ...] = getattr(self, which)
        keep = {r.id for r in self.rows if (r.reference if reference else fitted(r))}
        return Errors.of(p for p in ps if p.row in keep)


def report(table: Table, obs: list[Observation], shipped: SpeedConstants | None = None) -> Report:
    rows = list(table.rows)
    outs = leave_one_rig_out(rows, obs)
    held = {p.row: p for ro in outs for p in ro.predictions}
    return Report(
        rows=tuple(rows),
        guessed=tuple(predicted(rows, obs, GUESSES)),
        shipped=tuple(predicted(rows, obs, shipped or SpeedConstants())),
        refit=fit_rows([o for r, o in zip(rows, obs, strict=True) if fitted(r)]),
        held_out=tuple(held[r.id] for r in rows),
        rig_outs=tuple(outs),
    )
