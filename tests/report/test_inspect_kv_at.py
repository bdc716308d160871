"""`moetune inspect --json`'s ``kv_at``: written by the typed :class:`KvAt`, its keys in their order."""

from __future__ import annotations

from moetune.model.profile import ModelProfile
from moetune.report.inspect_view import KvAt, KvQuery, inspect_json, kv_at


def _profile() -> ModelProfile:
    arch = "gpt-oss"
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": 4,
        f"{arch}.embedding_length": 256,
        f"{arch}.attention.head_count": 4,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.attention.key_length": 64,
        f"{arch}.attention.value_length": 64,
        f"{arch}.attention.sliding_window": 1024,
    }
    return ModelProfile(arch=arch, files=("m.gguf",), metadata=meta, tensors=())


def test_kv_at_keeps_its_json_shape() -> None:
    q = KvQuery(ctx=4096, slots=1, ubatch=512)
    a = kv_at(_profile(), q)
    assert isinstance(a, KvAt) and a.total_bytes == a.full_bytes + a.swa_bytes > 0
    doc = inspect_json(_profile(), q)["kv_at"]
    assert doc == {
        "ctx": 4096,
        "parallel": 1,
        "ubatch": 512,
        "swa_full": False,
        "cache_type": "f16",
        "full_cells": 4096,
        "swa_cells": 1536,
        "full_bytes": a.full_bytes,
        "swa_bytes": a.swa_bytes,
        "total_bytes": a.full_bytes + a.swa_bytes,
    }
    assert list(doc) == list(a.to_json())
