"""The bugs the fuzzers found in the GGUF reader and the model profile, one regression test each, named
after what broke. Each failed on the code before its fix and checks what the user sees now."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest

from moetune.errors import InputError
from moetune.model.gguf_read import MAX_HEADER, read_gguf
from moetune.model.gguf_write import TensorToWrite, Typed, write_gguf
from moetune.model.profile import load_profile
from moetune.model.quants import by_name
from tests.fuzz.gguf_cases import Base, bases
from tests.fuzz.guard import bounded
from tests.helpers import run_cli


def _base(arch: str) -> Base:
    return next(b for b in bases() if b.name == arch)


def _model(path: Path, arch: str = "qwen3moe", tensors: list[TensorToWrite] | None = None, **changes: Any) -> Path:
    """The fuzzers' tiny model of ``arch`` with metadata changed (``ARCH`` in a key: the architecture;
    a value of None: the key removed)."""
    b = _base(arch)
    meta = dict(b.metadata)
    for k, v in changes.items():
        key = k.replace("__", ".").replace("ARCH", arch)
        if v is None:
            meta.pop(key, None)
        else:
            meta[key] = v
    write_gguf(path, meta, tensors if tensors is not None else list(b.tensors), sparse=True)
    return path


def _one_line_error(path: Path, *, contains: str, command: str = "inspect") -> str:
    """`moetune inspect` and `moetune plan` on the file: exit 2, one line, no traceback."""
    for argv in (["inspect", str(path)], ["plan", str(path), "--hw", "rtx-pro-6000x2"]):
        r = run_cli(*argv)
        assert r.exit_code == 2, (argv, r.stdout[-300:], r.stderr[-600:])
        assert "Traceback" not in r.stderr
        first = r.stderr.strip().splitlines()[0]
        assert first.startswith("Error:") and contains in first, r.stderr
    return first


def test_a_damaged_key_name_is_quoted_short_on_one_line(tmp_path: Path) -> None:
    # the name of the key whose type is unknown came out raw: line breaks, control bytes, kilobytes
    key = b"general.\narchitecture\x1b[2J" + b"x" * 3000  # a length that runs on into what follows
    p = tmp_path / "m.gguf"
    p.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<I", 99) + b"\0" * 64
    )
    line = _one_line_error(p, contains="corrupt header (unknown value type 99 in 'general.\\narchitecture")
    assert len(line) < 300


def test_a_tensor_of_zero_dimensions_is_one_element(tmp_path: Path) -> None:
    # ggml reads n_dims = 0 as one element; the size computation indexed shape[0] (IndexError)
    ts = [*_base("qwen3moe").tensors, TensorToWrite("rope_freqs.weight", (), by_name("f32"))]
    p = _model(tmp_path / "m.gguf", tensors=ts)
    t = next(t for t in load_profile(p).tensors if t.name == "rope_freqs.weight")
    assert (t.shape, t.nbytes) == ((), 4)
    assert run_cli("inspect", str(p), "--json").exit_code == 0


@pytest.mark.parametrize("value", [Typed(8, "32"), Typed(6, 32.0), Typed(4, [32])], ids=["string", "float", "array"])
def test_an_alignment_that_is_not_an_integer_is_refused(tmp_path: Path, value: Typed) -> None:
    class Alignment(Typed):
        def __int__(self) -> int:  # the writer lays the file out with 32; the file says `value`
            return 32

    p = _model(tmp_path / "m.gguf", general__alignment=Alignment(value.vtype, value.value))
    _one_line_error(p, contains="alignment")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("ARCH.block_count", "4"),
        ("ARCH.embedding_length", Typed(6, float("nan"))),
        ("ARCH.attention__head_count", Typed(4, [1] * 5000)),
        ("ARCH.expert_count", True),
        ("ARCH.context_length", Typed(11, -1)),
        ("ARCH.attention__key_length", [64, 64]),
    ],
    ids=["string", "nan", "skipped-array", "bool", "negative", "array-where-one-value"],
)
def test_a_hyperparameter_of_the_wrong_type_is_refused(tmp_path: Path, key: str, value: Any) -> None:
    # int() of a string, of NaN, of an array: ValueError or TypeError in the profile, inspect or plan
    p = _model(tmp_path / "m.gguf", **{key.replace(".", "__"): value})
    _one_line_error(p, contains=key.replace("ARCH", "qwen3moe").replace("__", "."))


def test_a_per_layer_array_shorter_than_the_layers_is_refused(tmp_path: Path) -> None:
    # head_count_kv as an array of 1 value per layer for 1 of 2 layers: IndexError in the KV formula
    p = _model(tmp_path / "m.gguf", ARCH__attention__head_count_kv=Typed(4, []))
    _one_line_error(p, contains="head_count_kv")
    p = _model(tmp_path / "n.gguf", "qwen35moe", ARCH__attention__recurrent_layers=Typed(7, [True]))
    _one_line_error(p, contains="recurrent_layers")


def test_a_per_layer_head_count_plans(tmp_path: Path) -> None:
    # llama.cpp allows one value per layer; the compute-buffer estimate took int() of the array
    p = _model(
        tmp_path / "m.gguf",
        ARCH__attention__head_count=Typed(4, [2, 2]),
        ARCH__attention__head_count_kv=Typed(4, [1, 1]),
        ARCH__feed_forward_length=Typed(4, [64, 64]),
    )
    assert run_cli("plan", str(p), "--hw", "rtx-pro-6000x2").exit_code == 0


def test_a_full_attention_interval_of_zero_is_refused(tmp_path: Path) -> None:
    # (i + 1) % 0 in the hybrid models' KV formula: ZeroDivisionError
    p = _model(tmp_path / "m.gguf", "qwen35moe", ARCH__full_attention_interval=0)
    _one_line_error(p, contains="full_attention_interval")


def test_a_huge_block_count_is_refused_at_once(tmp_path: Path) -> None:
    # 2^32-1 layers: the layer table looped over every one of them (a hang, then memory)
    p = _model(tmp_path / "m.gguf", ARCH__block_count=(1 << 32) - 1)
    t0 = time.monotonic()
    with bounded(), pytest.raises(InputError, match="block_count"):
        load_profile(p)
    assert time.monotonic() - t0 < 5


def test_a_tensor_beyond_the_last_layer_is_refused(tmp_path: Path) -> None:
    # the placement indexed its layer table with the tensor's layer: IndexError
    b = _base("qwen3moe")
    ts = [TensorToWrite(t.name.replace("blk.1.", "blk.7."), t.shape, t.qtype) for t in b.tensors]
    _one_line_error(_model(tmp_path / "m.gguf", tensors=ts), contains="layer 7")


def test_a_layer_number_of_thousands_of_digits_is_not_a_layer(tmp_path: Path) -> None:
    # int() refuses more than 4300 digits from a string: ValueError while reading tensor names
    ts = [*_base("qwen3moe").tensors, TensorToWrite(f"blk.{'1' * 5000}.ffn_up_exps.weight", (32,), by_name("f32"))]
    p = _model(tmp_path / "m.gguf", tensors=ts)
    t = next(t for t in load_profile(p).tensors if t.name.startswith("blk.111"))
    assert t.layer is None
    ts = [*_base("qwen3moe").tensors, TensorToWrite("blk.٣.ffn_up_exps.weight", (32,), by_name("f32"))]
    assert next(t for t in load_profile(_model(tmp_path / "n.gguf", tensors=ts)).tensors if "٣" in t.name).layer is None


def test_a_kv_row_a_quantized_cache_cannot_hold_is_said_not_raised(tmp_path: Path) -> None:
    # a 48-wide K row and a q8_0 cache (blocks of 32): ValueError out of `inspect`; the plan says why
    p = _model(tmp_path / "m.gguf", ARCH__attention__key_length=48, ARCH__attention__value_length=48)
    r = run_cli("inspect", str(p), "--json")
    assert r.exit_code == 0 and '"q8_0": null' in r.stdout
    r = run_cli("plan", str(p), "--hw", "rtx-pro-6000x2", "--ctk", "q8_0")
    assert r.exit_code == 2 and "KV cache type q8_0" in r.stderr


def test_a_damaged_string_count_over_a_sparse_region_stops_at_the_header_cap(tmp_path: Path) -> None:
    # a vocabulary count of 2^60 over a 2 GiB hole: the reader walked it 8 bytes at a time (48 s here;
    # hours on a sparse replica of a 320 GiB model); and it mapped the whole file, which fails under a
    # limit on address space (here the guard's; ulimit -v on a shared machine)
    key = b"tokenizer.ggml.tokens"
    p = tmp_path / "m.gguf"
    with open(p, "wb") as f:
        f.write(
            b"GGUF"
            + struct.pack("<IQQ", 3, 0, 1)
            + struct.pack("<Q", len(key))
            + key
            + struct.pack("<IIQ", 9, 8, 1 << 60)
        )
        f.truncate(2 << 30)
    with bounded(), pytest.raises(InputError, match=f"runs past {MAX_HEADER >> 20} MiB"):
        read_gguf(p)
