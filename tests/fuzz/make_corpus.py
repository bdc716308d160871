"""Write the seed corpus (tests/fuzz/corpus/): small inputs that once broke a reader, or sit at an
edge the random search reaches rarely. `make test` replays every file (tests/fuzz/test_corpus.py)
and the fuzzers start from them. Run from the repository root to regenerate:

    PYTHONPATH=src python -m tests.fuzz.make_corpus

A new failure the fuzzers find is added here (or its file dropped into the folder) with its fix.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path
from typing import Any

from moetune.model.gguf_write import TensorToWrite, Typed, write_gguf
from moetune.model.quants import by_name
from tests.fuzz.gguf_cases import CORPUS, Base, bases


def _gguf(name: str, data: bytes) -> None:
    (CORPUS / "gguf" / f"{name}.gguf.gz").write_bytes(gzip.compress(data, 9, mtime=0))


def _with(base: Base, tmp: Path, tensors: list[TensorToWrite] | None = None, **changes: Any) -> bytes:
    meta = dict(base.metadata)
    arch = base.name
    for k, v in changes.items():
        key = k.replace("__", ".").replace("ARCH", arch)
        meta[key] = v
        if v is None:
            del meta[key]
    p = tmp / "m.gguf"
    write_gguf(p, meta, tensors if tensors is not None else list(base.tensors), sparse=True)
    return p.read_bytes()


def _set(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def gguf(tmp: Path) -> None:
    b = {x.name: x for x in bases()}
    q = b["qwen3moe"]
    _gguf("zero-dim-tensor", _with(q, tmp, [*q.tensors, TensorToWrite("rope_freqs.weight", (), by_name("f32"))]))
    _gguf("block-count-string", _with(q, tmp, ARCH__block_count="4"))
    _gguf("block-count-u32-max", _with(q, tmp, ARCH__block_count=(1 << 32) - 1))
    _gguf("head-count-kv-empty-array", _with(q, tmp, ARCH__attention__head_count_kv=Typed(4, [])))
    _gguf("head-count-per-layer", _with(q, tmp, ARCH__attention__head_count=Typed(4, [2, 2])))
    _gguf("key-length-48", _with(q, tmp, ARCH__attention__key_length=48, ARCH__attention__value_length=48))
    _gguf("full-attention-interval-0", _with(b["qwen35moe"], tmp, ARCH__full_attention_interval=0))
    _gguf(
        "tensor-past-last-layer",
        _with(q, tmp, [TensorToWrite(t.name.replace("blk.1.", "blk.7."), t.shape, t.qtype) for t in q.tensors]),
    )
    _gguf(
        "layer-5000-digits",
        _with(q, tmp, [*q.tensors, TensorToWrite(f"blk.{'1' * 5000}.ffn_up_exps.weight", (32,), by_name("f32"))]),
    )
    key = b"general.\narchitecture\x1b[2J" + b"x" * 300
    _gguf(
        "key-name-control-chars",
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99) + b"\0" * 32,
    )
    # every kind of count and length of the first base at 2^60
    for f in q.fields:
        if f.kind in ("count", "length") and f.width == 8 and f.offset < 200:
            _gguf(f"{f.kind}-at-{f.offset}-2e60", _set(q.data, f.offset, "<Q", 1 << 60))
    _gguf("truncated-in-vocabulary", q.data[: q.header_end // 2])
    ds = b["deepseek2"]
    first_qtype = next(f for f in ds.fields if f.kind == "qtype")
    _gguf("ik-type-id-unknown", _set(ds.data, first_qtype.offset, "<I", 250))


HARDWARE = {
    "yaml-syntax-error": b"nodes:\n  - name: a\n   cpu: {cores: 1}\n",
    "key-with-line-break": b'nodes:\n  - name: a\n    "x\\ny": 1\n    cpu: {cores: 1, ram_mib: 1, ram_bw_gbs: 1}\n',
    "not-utf8": b"nodes:\n  - name: \xff\xfe\n    cpu: {cores: 1, ram_mib: 1, ram_bw_gbs: 1}\n",
    "nested-5000": b"[" * 5000,
    "infinite-bandwidth": b"nodes:\n  - name: a\n    cpu: {cores: 2, ram_mib: 4096, ram_bw_gbs: .inf}\n"
    b"    devices: [{name: CUDA0, mem_mib: 1e308, bw_gbs: .inf}]\n",
    "public-bind": b"nodes:\n  - name: a\n    cpu: {cores: 2, ram_mib: 4096, ram_bw_gbs: 50}\n  - name: b\n"
    b"    link_addr: 0.0.0.0\n    cpu: {cores: 2, ram_mib: 4096, ram_bw_gbs: 50}\n"
    b"    devices: [{name: CUDA0, mem_mib: 8192, bw_gbs: 500}]\n",
    "a-list-not-a-mapping": b"- nodes\n- 1\n",
    "reserved-infinite": b"nodes:\n  - name: a\n    cpu: {cores: 2, ram_mib: 4096, ram_bw_gbs: 50, reserved_mib: 1e309}\n",
}
LAYOUT = {
    "not-utf8": b"services:\n  - name: \xff\n    model: model.gguf\n",
    "duplicate-names": b"services:\n  - {name: a, model: model.gguf}\n  - {name: a, model: model.gguf}\n",
    "unknown-device": b"services:\n  - {name: a, model: model.gguf, devices: [CUDA9], strategy: all-gpu}\n",
    "ubatch-over-batch": b"services:\n  - {name: a, model: model.gguf, batch: 64, ubatch: 512}\n",
    "huge-context": b"services:\n  - {name: a, model: model.gguf, ctx: 1000000000000000000000}\n",
    "name-with-line-break": b'services:\n  - {name: "a\\nb", model: model.gguf}\n',
    "model-path-with-line-break": b'services:\n  - {name: a, model: "\\n\\n    "}\n',
}
LOGS = {
    "unreadable-numbers.mainline.log": (
        "0.00.001.000 I llama_context: n_ctx = .\n0.00.001.001 I prompt eval time = 1.2.3 ms / 5 tokens\n"
        f"0.00.001.002 I graph splits = {'9' * 5000}\n{'1' * 5000}.00.000.000 I load_tensors: CPU model buffer "
        "size = 1.0 MiB\n0.00.001.003 I load_tensors:   CPU_Mapped model buffer size = 10.5 MiB\n"
        f"0.00.001.004 E failed to allocate CUDA0 buffer of size {'1' * 400}\n"
    ),
    "unreadable-numbers.legacy.log": (
        "llm_load_tensors:  CUDA_Host buffer size = 1.2.3 MiB\nAllocating . GiB of pinned host memory\n"
        "llama_kv_cache_init:      CUDA0 KV buffer size =   784.15 MiB\n======== Cache: cache_size = 9, n_past0 = .\n"
    ),
    "allocation-5000-digits.mainline.log": f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {'1' * 5000} MiB "
    "on device 0: cudaMalloc failed\n",
    "rpc_worker-unreadable.log": "Starting RPC server v\n  CUDA0: X (. MiB, 1.2.3 MiB free)\n  CPU:  -1 MiB total, "
    "٣ MiB free\nAccepted client connection\n",
}
SSE = {
    "choices-null.sse": b'data: {"choices": [null]}\n\ndata: {"choices": [{"delta": {"content": "x"}}]}\n\n',
    "content-not-text.sse": b'data: {"choices": [{"delta": {"content": 7}}]}\n\n',
    "events-after-done.sse": b'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: [DONE]\n\n'
    b'data: {"choices": [{"delta": {"content": "bc"}}]}\n\n',
    "not-json.sse": b"data: {oops\n\n",
    "bare-cr.sse": b'data: {"choices": [{"delta": {"content": "a"}}]}\r\r\n\r\n',
    "content-length-negative.http": b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nabcdefghijk",
    "content-length-garbage-then-bytes.http": b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\njunk",
    "broken-chunk-after-data.http": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n",
    "chunk-size-with-spaces.http": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n 3 \r\n\r\n0\r\n\r\n",
}


def main() -> None:
    import tempfile

    for kind in ("gguf", "hardware", "layout", "logs", "sse"):
        (CORPUS / kind).mkdir(parents=True, exist_ok=True)
        for old in (CORPUS / kind).iterdir():
            if not old.name.startswith(".") and old.name != "README.md":
                old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        gguf(Path(tmp))
    for name, data in HARDWARE.items():
        (CORPUS / "hardware" / f"{name}.yaml").write_bytes(data)
    for name, data in LAYOUT.items():
        (CORPUS / "layout" / f"{name}.yaml").write_bytes(data)
    for name, text in LOGS.items():
        (CORPUS / "logs" / name).write_text(text)
    for name, data in SSE.items():
        (CORPUS / "sse" / name).write_bytes(data)


if __name__ == "__main__":
    main()
