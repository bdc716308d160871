"""Figures of the code's shape in src/moetune, each held under a ceiling that only goes down.

    python scripts/code_metrics.py          # print the figures; exit 1 when one is over its ceiling
    python scripts/code_metrics.py --json   # the same as JSON

The figures (issue #28's targets: documents typed at module borders, keyword arguments, short
functions):

- ``dict_str_any``: how many times ``dict[str, Any]`` is written in src/moetune;
- ``any_signature_pct``: the share of public function signatures (functions and methods whose
  name, and their class's, does not start with ``_``; not those inside a function) with ``Any`` in
  a parameter's or the return annotation, in %;
- ``positional_calls``: calls of moetune's own functions and classes (a name that src/moetune
  defines) with more than four positional arguments, found from the syntax (a call of another
  library's function with the same name counts too; a call through a variable does not);
- ``longest_function``: the lines of the longest function (its ``def`` to its last line), and
  the ten longest listed.

Make `lint` runs it. A change that lowers a figure should lower its ceiling in CEILINGS to the new
figure in the same commit (the script says so); a ceiling is never raised.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "moetune"

# the figures of 2026-12-02, night (issue #28's targets: dict_str_any down 80% from 403,
# positional_calls 0): lower
# one when the code gets better, never raise it
CEILINGS: dict[str, float] = {
    "dict_str_any": 76,
    "any_signature_pct": 7.11,
    "positional_calls": 0,
    "longest_function": 145,
}
MAX_POSITIONAL = 4  # more positional arguments than this in one call is counted
TOP = 10

DICT_STR_ANY = re.compile(r"\bdict\[\s*str\s*,\s*Any\s*\]")
Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True, slots=True)
class Where:
    path: str  # relative to the repository
    line: int
    name: str
    size: int  # lines of a function; positional arguments of a call

    def __str__(self) -> str:
        return f"{self.size:5d}  {self.path}:{self.line}  {self.name}"


def modules(root: Path) -> Iterator[tuple[str, ast.Module, str]]:
    """Every module under ``root`` (a package in ``src/``): its path from the repository, its
    syntax tree and its text."""
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        yield str(path.relative_to(root.parent.parent)), ast.parse(text, str(path)), text


def functions(tree: ast.Module) -> Iterator[tuple[str, Function, bool]]:
    """Every function and method: its qualified name (``Class.method``, ``outer.inner``), itself,
    and whether it is public (neither it nor its class named ``_...``, not inside a function)."""

    def walk(node: ast.AST, prefix: str, public: bool) -> Iterator[tuple[str, Function, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield prefix + child.name, child, public and not child.name.startswith("_")
                yield from walk(child, f"{prefix}{child.name}.", False)
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.", public and not child.name.startswith("_"))
            else:
                yield from walk(child, prefix, public)

    yield from walk(tree, "", True)


def mentions_any(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and node.id == "Any":
            return True
        if isinstance(node, ast.Attribute) and node.attr == "Any":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"\bAny\b", node.value):
            return True  # a quoted annotation
    return False


def signature_has_any(f: Function) -> bool:
    a = f.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]
    return mentions_any(f.returns) or any(mentions_any(p.annotation) for p in params)


def defined_names(trees: list[ast.Module]) -> set[str]:
    """The names of every function, method and class moetune defines (but Python's builtins:
    a method called ``format`` does not make every ``format(...)`` moetune's)."""
    out: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                out.add(node.name)
    return out - set(dir(builtins))


def called_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


@dataclass(frozen=True, slots=True)
class Metrics:
    figures: dict[str, float]  # the figures CEILINGS holds, by name
    public_signatures: int
    public_signatures_with_any: int
    longest_functions: list[Where]  # the TOP longest, longest first
    most_positional_calls: list[Where]  # the TOP calls with the most positional arguments

    def to_json(self) -> dict[str, object]:
        return {
            "figures": self.figures,
            "ceilings": CEILINGS,
            "public_signatures": self.public_signatures,
            "public_signatures_with_any": self.public_signatures_with_any,
            "longest_functions": [asdict(w) for w in self.longest_functions],
            "most_positional_calls": [asdict(w) for w in self.most_positional_calls],
        }


def measure(root: Path = SRC) -> Metrics:
    mods = list(modules(root))
    own = defined_names([tree for _, tree, _ in mods])
    dict_any = 0
    public = with_any = 0
    lengths: list[Where] = []
    calls: list[Where] = []
    for path, tree, text in mods:
        dict_any += len(DICT_STR_ANY.findall(text))
        for name, f, public_one in functions(tree):
            lengths.append(Where(path, f.lineno, name, (f.end_lineno or f.lineno) - f.lineno + 1))
            if public_one:
                public += 1
                with_any += signature_has_any(f)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and (n := called_name(node)) in own and len(node.args) > MAX_POSITIONAL:
                calls.append(Where(path, node.lineno, f"{n}()", len(node.args)))
    lengths.sort(key=lambda w: (-w.size, w.path, w.line))
    calls.sort(key=lambda w: (-w.size, w.path, w.line))
    figures: dict[str, float] = {
        "dict_str_any": dict_any,
        "any_signature_pct": round(100 * with_any / public, 2) if public else 0.0,
        "positional_calls": len(calls),
        "longest_function": lengths[0].size if lengths else 0,
    }
    return Metrics(figures, public, with_any, lengths[:TOP], calls[:TOP])


def verdicts(figures: dict[str, float], ceilings: dict[str, float]) -> tuple[list[str], list[str]]:
    """(figures over their ceiling, figures under it: the ceilings to lower)."""
    over = [f"{k} is {v:g}, over its ceiling {ceilings[k]:g}" for k, v in figures.items() if v > ceilings[k]]
    under = [
        f"{k} is {v:g}, under its ceiling {ceilings[k]:g}: lower CEILINGS[{k!r}] to {v:g} in {Path(__file__).name}"
        for k, v in figures.items()
        if v < ceilings[k]
    ]
    return over, under


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    m = measure()
    over, under = verdicts(m.figures, CEILINGS)
    if args.json:
        print(json.dumps({**m.to_json(), "over": over}, indent=2))
    else:
        print("code metrics of src/moetune (figure / ceiling):")
        for k, v in m.figures.items():
            print(f"  {k:<20} {v:>7g} / {CEILINGS[k]:g}")
        print(f"  ({m.public_signatures_with_any} of {m.public_signatures} public signatures carry Any)")
        print(f"the {TOP} longest functions (lines):")
        for w in m.longest_functions:
            print(f"  {w}")
        print(f"the {TOP} calls with the most positional arguments (of those with more than {MAX_POSITIONAL}):")
        for w in m.most_positional_calls:
            print(f"  {w}")
    for line in under:
        print(f"note: {line}", file=sys.stderr)
    for line in over:
        print(f"error: {line}", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
