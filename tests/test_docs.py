"""README.md stays true (as sqlite-utils' tests/test_docs.py): every command and subcommand the CLI
has is documented, and the README's runnable examples run.

Documented: README shows ``moetune NAME`` (``moetune GROUP SUB`` for a subcommand) in code, a
fenced block, an inline span or a heading; ``moetune engine install|list|add`` documents each.
Runnable: a fenced block right after a ``<!-- runs in tests/test_docs.py -->`` line. Its ``$ moetune``
lines run in order, in one directory holding what the README's examples name: the sparse GLM-5.1
replica and the log fixtures (tests/fixtures/logs); other lines are excerpts of output and are not
compared.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import click
import pytest

from moetune.cli import cli
from tests.helpers import run_cli

README = Path(__file__).resolve().parent.parent / "README.md"
LOGS = Path(__file__).resolve().parent / "fixtures" / "logs"
RUNS_MARK = "<!-- runs in tests/test_docs.py -->"
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_MENTION = re.compile(r"moetune ([a-z][a-z-]*(?:\|[a-z][a-z-]*)*)(?: ([a-z][a-z-]*(?:\|[a-z][a-z-]*)*))?")


def command_paths(group: click.Group, prefix: str = "") -> list[str]:
    """Every command and subcommand, walked through the lazy group (so each module is imported)."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        paths.append(prefix + name)
        if isinstance(cmd, click.Group):
            paths += command_paths(cmd, prefix + name + " ")
    return paths


def documented(text: str) -> set[str]:
    code = [m[1] for m in _FENCE.finditer(text)]
    code += _INLINE.findall(text.replace("\\|", "|"))
    code += [line for line in text.splitlines() if line.startswith("#")]
    found: set[str] = set()
    for chunk in code:
        for m in _MENTION.finditer(chunk):
            for top in m[1].split("|"):
                found.add(top)
                found.update(f"{top} {sub}" for sub in (m[2] or "").split("|") if sub)
    return found


def runnable_commands(text: str) -> list[list[str]]:
    cmds = []
    for block in re.split(re.escape(RUNS_MARK) + r"\n", text)[1:]:
        m = _FENCE.match(block)
        assert m, f"{RUNS_MARK} must come right before a fenced block"
        joined = m[1].replace("\\\n", " ")
        cmds += [shlex.split(line)[2:] for line in joined.splitlines() if line.startswith("$ moetune ")]
    return cmds


def test_every_command_is_documented() -> None:
    missing = [p for p in command_paths(cli) if p not in documented(README.read_text())]
    assert not missing, f"README.md does not show: {', '.join('moetune ' + p for p in missing)}"


def test_readme_keeps_its_first_lines() -> None:
    assert README.read_text().splitlines()[2:6] == [
        "```",
        "make demo    # the main job end to end on a built-in example (builds llama.cpp the first time)",
        "make test    # the full test suite (the same command CI runs)",
        "```",
    ]


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("readme")
    r = run_cli("testmodel", str(d / "GLM-5.1.gguf"), "--preset", "glm-5.1", "--shards", "8", "--sparse")
    assert r.exit_code == 0, r.stderr
    for log in LOGS.glob("*.log"):
        shutil.copy(log, d)
    return d


@pytest.mark.parametrize("argv", runnable_commands(README.read_text()), ids=" ".join)
def test_readme_example_runs(argv: list[str], example_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(example_dir)
    r = run_cli(*argv)
    assert r.exit_code == 0, f"moetune {' '.join(argv)}: {r.stderr}"
