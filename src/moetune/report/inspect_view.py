"""`moetune inspect` output: a JSON document and rich tables, both from one ModelProfile.

rich is imported only to print tables, so `inspect --json` does not load it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from moetune.errors import InputError
from moetune.kinds import EngineKind
from moetune.model.kv import CACHE_TYPES, KVShape, kv_shape
from moetune.model.profile import EXPERT_KINDS, ModelProfile

if TYPE_CHECKING:
    from rich.console import Console

MIB = 1 << 20
SCHEMA_VERSION = 1


def mib(n: int | float) -> float:
    return round(n / MIB, 2)


def inspect_json(p: ModelProfile) -> dict[str, Any]:
    kv = kv_shape(p)
    kv_ik = kv_shape(p, EngineKind.IK)
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
        "kv_bytes_per_token_by_engine": {EngineKind.MAINLINE: _kv_bytes(kv), EngineKind.IK: _kv_bytes(kv_ik)},
        "recurrent_layers": len(kv.recurrent_layers),
        "rs_bytes_per_seq": kv.rs_bytes_per_seq,
        **(_remote_json(p) if p.remote else {}),
    }


def _kv_bytes(kv: KVShape) -> dict[str, int | None]:
    """KV bytes per token by cache type; None for a type that cannot hold the model's rows."""
    out: dict[str, int | None] = {}
    for t in CACHE_TYPES:
        try:
            out[t] = kv.bytes_per_token(t, t)
        except InputError:
            out[t] = None
    return out


def _per_1k(n: int | None) -> str:
    return "-" if n is None else f"{mib(n * 1024):.2f}"


def _remote_json(p: ModelProfile) -> dict[str, Any]:
    r = p.remote
    assert r is not None
    return {"bytes_fetched": r.bytes_fetched, "requests": r.requests, "download": r.download,
            "local_path": r.local_path}


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


def print_inspect(p: ModelProfile, console: Console) -> None:
    from rich.table import Table  # here, so that --json never imports rich

    doc = inspect_json(p)
    console.print(f"[bold]{p.arch}[/]  {doc['name'] or ''}  ({len(p.files)} file{'s' if len(p.files) > 1 else ''})")
    hp = Table.grid(padding=(0, 2))
    for k in ("n_layer", "n_layer_trunk", "n_nextn", "n_dense_lead", "n_expert", "n_expert_used",
              "n_embd", "n_vocab", "context_length", "attention"):
        hp.add_row(k, str(doc[k]))
    console.print(hp)
    t = Table(title="layers (MiB)", show_lines=False)
    for col in ("layers", "kind", "gate_exps", "up_exps", "down_exps", "experts", "non-expert"):
        t.add_column(col, justify="right" if col not in ("kind",) else "left")
    for label, cells in _compress_rows(p):
        t.add_row(label, *cells)
    console.print(t)
    tot = Table(title="totals")
    tot.add_column("what")
    tot.add_column("MiB", justify="right")
    tot.add_column("GiB", justify="right")
    for label, n in (("experts", p.expert_bytes), ("non-expert", p.other_bytes), ("all tensors", p.total_bytes),
                     ("loaded by llama.cpp (no NextN)", p.loaded_bytes())):
        tot.add_row(label, f"{mib(n):,.2f}", f"{n / (1 << 30):,.2f}")
    for ty, n in doc["bytes_by_type"].items():
        tot.add_row(f"  {ty}", f"{mib(n):,.2f}", f"{n / (1 << 30):,.2f}")
    console.print(tot)
    kv = Table(title="KV cache per 1k tokens (MiB)")
    kv.add_column("cache type")
    kv.add_column(EngineKind.MAINLINE, justify="right")
    kv.add_column(EngineKind.IK, justify="right")
    for ty in CACHE_TYPES:
        kv.add_row(ty, _per_1k(doc["kv_bytes_per_token_by_engine"][EngineKind.MAINLINE][ty]),
                   _per_1k(doc["kv_bytes_per_token_by_engine"][EngineKind.IK][ty]))
    console.print(kv)
    if doc["rs_bytes_per_seq"]:
        console.print(f"recurrent state: {mib(doc['rs_bytes_per_seq']):.2f} MiB per sequence "
                      f"({doc['recurrent_layers']} recurrent layers, F32)")
    if p.remote:
        console.print(f"remote: {p.remote.fetched_text()} (headers of {len(p.files)} file"
                      f"{'s' if len(p.files) > 1 else ''}); download: {p.remote.download}", markup=False)
