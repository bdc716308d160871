"""`moetune inspect` output: a JSON document and rich tables, both from one ModelProfile.

rich is imported only to print tables, so `inspect --json` does not load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.kv import CACHE_TYPES, KVShape, full_cells, kv_shape, swa_cells
from moetune.model.profile import EXPERT_KINDS, ModelProfile

if TYPE_CHECKING:
    from rich.console import Console

MIB = 1 << 20
SCHEMA_VERSION = 1


def mib(n: int | float) -> float:
    return round(n / MIB, 2)


@dataclass(frozen=True, slots=True, kw_only=True)
class KvQuery:
    """The context `inspect` totals the KV cache at (its --ctx, --parallel, -ub, --ctk, --swa-full)."""

    ctx: int = 4096
    slots: int = 1
    ubatch: int = 512
    cache_type: str = "f16"
    swa_full: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class KvAt:
    """KV cells and bytes at a query's context, slots and ubatch (the document's ``kv_at``)."""

    q: KvQuery
    full_cells: int
    swa_cells: int
    full_bytes: int
    swa_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.full_bytes + self.swa_bytes

    def to_json(self) -> dict[str, object]:
        q = self.q
        return {
            "ctx": q.ctx,
            "parallel": q.slots,
            "ubatch": q.ubatch,
            "swa_full": q.swa_full,
            "cache_type": q.cache_type,
            "full_cells": self.full_cells,
            "swa_cells": self.swa_cells,
            "full_bytes": self.full_bytes,
            "swa_bytes": self.swa_bytes,
            "total_bytes": self.total_bytes,
        }


def kv_at(p: ModelProfile, q: KvQuery) -> KvAt:
    """KV cells and bytes at the query's context, slots and ubatch, as llama.cpp sizes them (the
    ledger's rule, ``model.kv``): the full-attention layers' cache and the sliding-window layers'."""
    kv = kv_shape(p)
    full, windowed = kv.bytes_per_token_split(q.cache_type, q.cache_type)
    cells, cells_swa = full_cells(q.ctx, q.slots), swa_cells(q.ctx, q.slots, q.ubatch, kv.n_swa, swa_full=q.swa_full)
    return KvAt(
        q=q,
        full_cells=cells,
        swa_cells=cells_swa if kv.n_swa else 0,
        full_bytes=full * cells,
        swa_bytes=windowed * cells_swa,
    )


def inspect_json(p: ModelProfile, at: KvQuery | None = None) -> dict[str, object]:
    kv = kv_shape(p)
    kv_ik = kv_shape(p, EngineKind.IK)
    swa = [lk.layer for lk in kv.layers if lk.swa]
    return {
        "schema_version": SCHEMA_VERSION,
        "arch": p.arch,
        "name": p.metadata.get("general.name"),
        "files": [str(f) for f in p.files],
        "n_layer": p.n_layer_all,
        "n_layer_trunk": p.n_layer,
        "n_nextn": p.n_nextn,
        "n_dense_lead": p.n_dense_lead,
        "n_expert": p.n_expert,
        "n_expert_used": p.n_expert_used,
        "n_embd": p.n_embd,
        "n_vocab": p.n_vocab,
        "context_length": p.hp("context_length"),
        "attention": kv.family,
        "n_tensors": len(p.tensors),
        "total_bytes": p.total_bytes,
        "expert_bytes": p.expert_bytes,
        "other_bytes": p.other_bytes,
        "loaded_bytes": p.loaded_bytes(),
        "bytes_by_type": p.bytes_by_type(),
        "expert_bytes_by_type": p.bytes_by_type(experts=True),
        "layers": [
            {
                "index": layer.index,
                "kind": layer.kind,
                "expert_bytes": layer.expert_bytes,
                "other_bytes": layer.other_bytes,
                "experts": {k: {"type": t, "bytes": b} for k, (t, b) in layer.experts.items()},
            }
            for layer in p.layers
        ],
        "kv_layers": len(kv.layers),
        "kv_bytes_per_token": _kv_bytes(kv),
        "sliding_window": kv.n_swa,
        "swa_layers": swa,
        # mainline's per token of the full-attention layers and of the windowed ones (whose cache
        # holds about a window per sequence, not the context)
        "kv_bytes_per_token_full": _kv_bytes(kv, swa=False),
        "kv_bytes_per_token_swa": _kv_bytes(kv, swa=True),
        "kv_at": kv_at(p, at or KvQuery()).to_json(),
        "kv_bytes_per_token_by_engine": {EngineKind.MAINLINE: _kv_bytes(kv), EngineKind.IK: _kv_bytes(kv_ik)},
        "recurrent_layers": len(kv.recurrent_layers),
        "rs_bytes_per_seq": kv.rs_bytes_per_seq,
        **(_remote_json(p) if p.remote else {}),
    }


def _kv_bytes(kv: KVShape, swa: bool | None = None) -> dict[str, int | None]:
    """KV bytes per token by cache type (of every layer, or of the windowed or full ones only);
    None for a type that cannot hold the model's rows."""
    out: dict[str, int | None] = {}
    for t in CACHE_TYPES:
        try:
            out[t] = kv.bytes_per_token(t, t) if swa is None else kv.bytes_per_token_split(t, t)[int(swa)]
        except InputError:
            out[t] = None
    return out


def _per_1k(n: int | None) -> str:
    return "-" if n is None else f"{mib(n * 1024):.2f}"


def _remote_json(p: ModelProfile) -> dict[str, object]:
    r = p.remote
    assert r is not None
    return {
        "bytes_fetched": r.bytes_fetched,
        "requests": r.requests,
        "download": r.download,
        "local_path": r.local_path,
    }


def _compress_rows(p: ModelProfile) -> list[tuple[str, list[Any]]]:
    """Group consecutive layers that look alike, so 79 layers print as a handful of rows."""
    rows: list[tuple[str, list[Any]]] = []
    prev_sig: tuple[Any, ...] | None = None
    start = 0
    for layer in p.layers:
        cells = [layer.kind]
        for k in EXPERT_KINDS[:3]:
            t = layer.experts.get(k)
            cells.append(f"{t[0]} {mib(t[1]):.0f}" if t else "")
        cells += [f"{mib(layer.expert_bytes):.1f}", f"{mib(layer.other_bytes):.1f}"]
        sig = tuple(cells)
        if sig == prev_sig:
            rows[-1] = (f"{start}-{layer.index}", cells)
        else:
            start = layer.index
            rows.append((str(layer.index), cells))
        prev_sig = sig
    return rows


def print_inspect(p: ModelProfile, console: Console, at: KvQuery | None = None) -> None:
    from rich.table import Table  # here, so that --json never imports rich

    doc = inspect_json(p, at)
    console.print(f"[bold]{p.arch}[/]  {doc['name'] or ''}  ({len(p.files)} file{'s' if len(p.files) > 1 else ''})")
    hp = Table.grid(padding=(0, 2))
    for k in (
        "n_layer",
        "n_layer_trunk",
        "n_nextn",
        "n_dense_lead",
        "n_expert",
        "n_expert_used",
        "n_embd",
        "n_vocab",
        "context_length",
        "attention",
    ):
        hp.add_row(k, str(doc[k]))
    console.print(hp)
    t = Table(title="layers (MiB)", show_lines=False)
    # the columns of _compress_rows: the first three expert kinds (gate, up, down), without ffn_
    expert_cols = [k.removeprefix("ffn_") for k in EXPERT_KINDS[:3]]
    for col in ("layers", "kind", *expert_cols, "experts", "non-expert"):
        t.add_column(col, justify="right" if col not in ("kind",) else "left")
    for label, cells in _compress_rows(p):
        t.add_row(label, *cells)
    console.print(t)
    tot = Table(title="totals")
    tot.add_column("what")
    tot.add_column("MiB", justify="right")
    tot.add_column("GiB", justify="right")
    for label, n in (
        ("experts", p.expert_bytes),
        ("non-expert", p.other_bytes),
        ("all tensors", p.total_bytes),
        ("loaded by llama.cpp (no NextN)", p.loaded_bytes()),
    ):
        tot.add_row(label, f"{mib(n):,.2f}", f"{n / (1 << 30):,.2f}")
    for ty, n in p.bytes_by_type().items():
        tot.add_row(f"  {ty}", f"{mib(n):,.2f}", f"{n / (1 << 30):,.2f}")
    console.print(tot)
    shape, shape_ik = kv_shape(p), kv_shape(p, EngineKind.IK)
    mainline, ik = _kv_bytes(shape), _kv_bytes(shape_ik)
    full, windowed = _kv_bytes(shape, swa=False), _kv_bytes(shape, swa=True)
    kv = Table(title="KV cache per 1k tokens (MiB)")
    kv.add_column("cache type")
    kv.add_column(EngineKind.MAINLINE, justify="right")
    if shape.n_swa:
        n_swa = sum(1 for lk in shape.layers if lk.swa)
        kv.add_column(f"{len(shape.layers) - n_swa} full layers", justify="right")
        kv.add_column(f"{n_swa} windowed ({shape.n_swa} tokens)", justify="right")
    kv.add_column(EngineKind.IK, justify="right")
    for ty in CACHE_TYPES:
        row = [_per_1k(mainline[ty])]
        if shape.n_swa:
            row += [_per_1k(full[ty]), _per_1k(windowed[ty])]
        kv.add_row(ty, *row, _per_1k(ik[ty]))
    console.print(kv)
    a = kv_at(p, at or KvQuery())
    text = (
        f"KV cache at --ctx {a.q.ctx} --parallel {a.q.slots} ({a.q.cache_type}, llama.cpp): "
        f"{mib(a.total_bytes):,.2f} MiB"
    )
    if shape.n_swa:
        text += (
            f" = full layers {mib(a.full_bytes):,.2f} MiB ({a.full_cells} cells) + windowed "
            f"{mib(a.swa_bytes):,.2f} MiB ({a.swa_cells} cells at -ub {a.q.ubatch}"
            f"{', --swa-full' if a.q.swa_full else ''})"
        )
    console.print(text, markup=False)
    if shape.rs_bytes_per_seq:
        console.print(
            f"recurrent state: {mib(shape.rs_bytes_per_seq):.2f} MiB per sequence "
            f"({len(shape.recurrent_layers)} recurrent layers, F32)"
        )
    if p.remote:
        console.print(
            f"remote: {p.remote.fetched_text()} (headers of {len(p.files)} file"
            f"{'s' if len(p.files) > 1 else ''}); download: {p.remote.download}",
            markup=False,
        )
