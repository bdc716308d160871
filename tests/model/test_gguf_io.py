"""GGUF writer and header reader: round trips, shards, sparse files, and every bad-input case."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from moetune.errors import InputError
from moetune.model.archs import Dims
from moetune.model.gguf_read import read_gguf, read_model_files, shard_paths
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate
from tests.helpers import run_cli


def test_round_trip_single_file(tmp_path: Path) -> None:
    g = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=2), "q8_0")
    f = read_gguf(g.files[0])
    assert f.metadata["general.architecture"] == "qwen3moe"
    assert len(f.tensors) == g.n_tensors
    assert sum(t.nbytes for t in f.tensors) == g.tensor_bytes
    assert f.tensors[0].offset % 32 == 0


def test_shards_are_named_like_gguf_split_and_found_from_any(tmp_path: Path) -> None:
    g = generate(tmp_path / "m.gguf", "glm4moe", Dims(n_layer=3, n_dense_lead=1), shards=3)
    assert [p.name for p in g.files] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    for p in g.files:
        assert shard_paths(p) == g.files
    files = read_model_files(g.files[1])
    assert [f.metadata["split.no"] for f in files] == [0, 1, 2]
    assert sum(len(f.tensors) for f in files) == g.n_tensors
    assert all(f.tensors for f in files)


def test_sparse_file_costs_no_disk(tmp_path: Path) -> None:
    g = generate(tmp_path / "s.gguf", "qwen3moe", Dims(n_layer=8, n_embd=1024, n_ff_exp=512, n_expert=64), sparse=True)
    st = g.files[0].stat()
    assert st.st_size > 400 << 20
    assert st.st_blocks * 512 < 1 << 20
    assert load_profile(g.files[0]).total_bytes == g.tensor_bytes


def _check_error(path: Path, *, contains: str) -> None:
    with pytest.raises(InputError) as e:
        load_profile(path)
    assert contains in str(e.value)
    before = set(path.parent.iterdir())
    r = run_cli("inspect", str(path))
    assert r.exit_code == 2
    assert "Traceback" not in r.stderr
    assert contains in r.stderr
    assert r.stderr.strip().splitlines()[0].startswith("Error:")
    assert r.stdout == ""
    assert set(path.parent.iterdir()) == before  # nothing written


def test_truncated_file(tmp_path: Path) -> None:
    g = generate(tmp_path / "t.gguf", "qwen3moe", Dims(n_layer=2))
    p = g.files[0]
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    _check_error(p, contains="truncated")


def test_truncated_inside_header(tmp_path: Path) -> None:
    g = generate(tmp_path / "t.gguf", "qwen3moe", Dims(n_layer=2))
    p = g.files[0]
    p.write_bytes(p.read_bytes()[:300])
    _check_error(p, contains="truncated")


@pytest.mark.parametrize("damage", ["cut", "huge_length"])
def test_damaged_vocabulary(tmp_path: Path, damage: str) -> None:
    """The long token list is skipped, not parsed: a cut or a wild string length is still reported."""
    g = generate(tmp_path / "v.gguf", "qwen3moe", Dims(n_layer=2, n_vocab=6000), sparse=True)
    p = g.files[0]
    raw = bytearray(p.read_bytes())
    key = raw.index(b"tokenizer.ggml.tokens")
    first_len = key + len(b"tokenizer.ggml.tokens") + 4 + 4 + 8  # value type, item type, count
    assert struct.unpack_from("<Q", raw, first_len)[0] < 64
    if damage == "cut":
        raw = raw[: first_len + 3000]
    else:
        struct.pack_into("<Q", raw, first_len + 8 + struct.unpack_from("<Q", raw, first_len)[0], (1 << 64) - 1)
    p.write_bytes(bytes(raw))
    _check_error(p, contains="truncated")


def test_corrupt_header(tmp_path: Path) -> None:
    g = generate(tmp_path / "c.gguf", "qwen3moe", Dims(n_layer=2))
    p = g.files[0]
    raw = bytearray(p.read_bytes())
    raw[0:4] = b"GGUX"
    p.write_bytes(bytes(raw))
    _check_error(p, contains="not a GGUF file")
    raw[0:4] = b"GGUF"
    raw[16:24] = struct.pack("<Q", 1 << 40)  # absurd metadata count
    p.write_bytes(bytes(raw))
    _check_error(p, contains="corrupt header")


def test_missing_shard(tmp_path: Path) -> None:
    g = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=3), shards=3)
    g.files[1].unlink()
    _check_error(g.files[0], contains="missing shard m-00002-of-00003.gguf")


def test_unknown_quant_type(tmp_path: Path) -> None:
    g = generate(tmp_path / "u.gguf", "qwen3moe", Dims(n_layer=2))
    p = g.files[0]
    f = read_gguf(p)
    raw = bytearray(p.read_bytes())
    # patch the type id of the last tensor info (type u32 sits right before its u64 offset)
    name = f.tensors[-1].name.encode()
    at = raw.rindex(name) + len(name) + 4 + 8 * len(f.tensors[-1].shape)
    raw[at : at + 4] = struct.pack("<I", 999)
    p.write_bytes(bytes(raw))
    _check_error(p, contains=f"tensor '{f.tensors[-1].name}' has unknown type id 999")


def test_no_such_file(tmp_path: Path) -> None:
    r = run_cli("inspect", str(tmp_path / "nope.gguf"))
    assert r.exit_code == 2 and "no such GGUF file" in r.stderr
