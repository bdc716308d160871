"""Hardware and layout documents to mutate, and the Hypothesis strategies that mutate them.

Valid documents (the built-in hardware examples, a two-service layout, and the seed corpus under
tests/fuzz/corpus/{hardware,layout}) are changed where a user's hand or a broken script changes
them: a value replaced by one of the wrong type, sign or size, a key removed or misspelled, an entry
duplicated, the text itself cut, spliced or made invalid UTF-8.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from hypothesis import strategies as st

from moetune.hardware import inventory

CORPUS = Path(__file__).parent / "corpus"

LAYOUT = """\
services:
  - name: orchestrator
    model: model.gguf
    strategy: auto
    ctx: 8192
    ctk: q8_0
    ctv: q8_0
    batch: 1024
    ubatch: 512
  - name: coder
    model: model.gguf
    devices: [CUDA0]
    strategy: all-gpu
    parallel: 2
    ctx: 4096
    port: 8081
"""


@cache
def hardware_texts() -> dict[str, str]:
    """Valid hardware files: the built-in examples and the corpus's, by name."""
    out = {
        f"example:{n}": (Path(inventory.__file__).parent / "examples" / f"{n}.yaml").read_text()
        for n in inventory.examples()
    }
    out.update({p.name: p.read_text(errors="replace") for p in _corpus("hardware")})
    return out


@cache
def layout_texts() -> dict[str, str]:
    out = {"layout": LAYOUT}
    out.update({p.name: p.read_text(errors="replace") for p in _corpus("layout")})
    return out


def _corpus(kind: str) -> list[Path]:
    d = CORPUS / kind
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml")) if d.is_dir() else []


def hostile_scalars() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 10**30, -(10**30), 65535, 65536]),
        st.integers(),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(
            [
                "",
                "0",
                "1e309",
                "-inf",
                ".nan",
                "CUDA0",
                "CPU",
                "RPC0",
                "0.0.0.0",
                "::",
                "127.0.0.1",
                "10.0.0.2",
                "auto",
                "all-gpu",
                "-oProxyCommand=x",
                "a b",
                "x\ny",
                "f16",
                "q4_0",
                "ik_llama.cpp",
            ]
        ),
        st.text(max_size=20),
    )


def hostile_values() -> st.SearchStrategy[Any]:
    scalars = hostile_scalars()
    return st.one_of(
        scalars,
        scalars,
        scalars,
        st.lists(scalars, max_size=3),
        st.dictionaries(st.text(max_size=8), scalars, max_size=3),
        st.integers(50, 200).map(lambda n: _nest(n)),
    )


def _nest(depth: int) -> Any:
    v: Any = 1
    for _ in range(depth):
        v = [v]
    return v


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a node of a YAML tree (keys and list indexes)."""
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*at, i))
    return out


def _parent(doc: Any, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        doc = doc[k]
    return doc


@dataclass(frozen=True)
class Doc:
    """A mutated document: its text as written to the file; shown by the base and what changed."""

    base: str
    ops: tuple[tuple[Any, ...], ...]
    text: bytes = field(repr=False)


def _parsed(texts: dict[str, str]) -> dict[str, Any]:
    out = {}
    for name, text in texts.items():
        with contextlib.suppress(yaml.YAMLError, RecursionError):  # not YAML: mangled_texts takes it
            out[name] = yaml.safe_load(text)
    return out


def mutated_docs(texts: dict[str, str]) -> st.SearchStrategy[Doc]:
    return _mutated_docs(_parsed(texts))


@st.composite
def _mutated_docs(draw: st.DrawFn, docs: dict[str, Any]) -> Doc:
    name = draw(st.sampled_from(sorted(docs)))
    doc = copy.deepcopy(docs[name])
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("replace", "replace", "replace", "delete", "add", "duplicate")))
        paths = [p for p in _paths(doc) if p]
        if not paths or not isinstance(doc, dict | list):
            break
        path = draw(st.sampled_from(paths))
        parent = _parent(doc, path)
        if op == "replace":
            parent[path[-1]] = draw(hostile_values())
        elif op == "delete":
            del parent[path[-1]]
        elif op == "add" and isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "mem_mib", "name", "devices", "cpu", "nodes", "services"]))] = draw(
                hostile_values()
            )
        elif op == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
        ops.append((op, path))
    out = yaml.safe_dump(doc, allow_unicode=True).encode()
    return Doc(name, tuple(ops), out)


@st.composite
def mangled_texts(draw: st.DrawFn, texts: dict[str, str]) -> Doc:
    """A valid file's text cut, spliced with random bytes or made invalid UTF-8."""
    name = draw(st.sampled_from(sorted(texts)))
    data = bytearray(texts[name].encode())
    ops: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(("truncate", "insert", "delete", "byte")))
        i = draw(st.integers(0, len(data)))
        if op == "truncate":
            del data[i:]
        elif op == "insert":
            blob = draw(
                st.one_of(
                    st.binary(max_size=8),
                    st.sampled_from(
                        [
                            b"\xff",
                            b"\xc3",
                            b"\t",
                            b"&a ",
                            b"*a",
                            b"!!python/object:os.system ",
                            b"[",
                            b"{",
                            b": ",
                            b"- ",
                            b"\n  ",
                            b"---\n",
                            b"%YAML 1.1\n",
                            b"\x00",
                        ]
                    ),
                )
            )
            data[i:i] = blob
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif data:
            data[min(i, len(data) - 1)] = draw(st.integers(0, 255))
        ops.append((op, i))
    return Doc(name, tuple(ops), bytes(data))
