"""scripts/code_metrics.py: its figures on a package written here, and its ratchet (a figure over
its ceiling fails, one under it says which ceiling to lower). `make lint` holds the tree to the
ceilings; this does not."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cm() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("code_metrics", ROOT / "scripts" / "code_metrics.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["code_metrics"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


PKG = {
    "a.py": """
        from typing import Any

        def public(x: dict[str, Any]) -> int:
            return 1

        def typed(x: int, *, y: str = "") -> dict[str, int]:
            def inner(z: Any) -> Any:  # nested: not a public signature
                return z

            return {}

        def _private(x: Any) -> None:
            pass

        class Thing:
            def method(self, **kw: "Any") -> None:  # quoted
                pass

            def __init__(self, a: int, b: int, c: int, d: int, e: int) -> None:
                pass

        class _Hidden:
            def method(self) -> Any:
                pass
        """,
    "b.py": """
        import json

        from pkg.a import Thing, public, typed

        def long_one() -> None:
            Thing(1, 2, 3, 4, 5)  # five positional: counted
            Thing(1, 2, 3, 4, e=5)  # four: not
            typed(*[1, 2, 3, 4, 5])  # one starred argument
            print(1, 2, 3, 4, 5)  # a builtin
            json.dumps(1, 2, 3, 4, 5)  # not a name the package defines
            x: dict[str, Any] = {}  # written twice here: dict[str,Any]
        """,
}


def _package(tmp_path: Path) -> Path:
    root = tmp_path / "src" / "pkg"
    root.mkdir(parents=True)
    for name, text in PKG.items():
        (root / name).write_text(textwrap.dedent(text))
    return root


def test_the_figures(cm: types.ModuleType, tmp_path: Path) -> None:
    m = cm.measure(_package(tmp_path))
    # public: public, typed, Thing.method, long_one (the nested, private, dunder and _Hidden's are not)
    assert (m.public_signatures, m.public_signatures_with_any) == (4, 2)
    assert m.figures == {
        "dict_str_any": 3,
        "any_signature_pct": 50.0,  # 2 of 4
        "positional_calls": 1,
        "longest_function": 7,
    }
    assert [(w.path, w.name, w.size) for w in m.most_positional_calls] == [("src/pkg/b.py", "Thing()", 5)]
    longest = m.longest_functions[0]
    assert (longest.path, longest.line, longest.name) == ("src/pkg/b.py", 6, "long_one")
    assert {w.name for w in m.longest_functions} >= {"typed.inner", "Thing.__init__", "_Hidden.method"}


def test_the_ratchet(cm: types.ModuleType) -> None:
    ceilings = {"a": 10.0, "b": 5.0, "c": 1.0}
    over, under = cm.verdicts({"a": 10.0, "b": 6.0, "c": 0.0}, ceilings)
    assert over == ["b is 6, over its ceiling 5"]
    assert under == ["c is 0, under its ceiling 1: lower CEILINGS['c'] to 0 in code_metrics.py"]
