"""The lazy command group: the table matches what the modules register, and a command imports only
what it needs (checked by the modules loaded, not by timing)."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import click
import pytest

from moetune.cli import COMMANDS, cli, load_module_commands
from moetune.model.archs import Dims
from moetune.model.testmodel import generate
from tests.helpers import run_cli

HEAVY = ("numpy", "gguf", "pydantic", "rich", "aiohttp", "httpx", "yaml", "matplotlib")


def test_every_module_registers_exactly_the_commands_the_table_gives_it() -> None:
    by_module: dict[str, set[str]] = defaultdict(set)
    for name, entry in COMMANDS.items():
        by_module[entry.module].add(name)
    for module, names in by_module.items():
        assert set(load_module_commands(module)) == names, module


def test_a_loaded_command_shows_the_tables_short_help() -> None:
    ctx = click.Context(cli)
    for name, entry in COMMANDS.items():
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.name == name
        assert cmd.get_short_help_str(limit=200) == entry.short_help


def test_help_lists_every_command_with_its_short_help() -> None:
    r = run_cli("--help")
    assert r.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in r.stdout


def test_unknown_command_is_a_usage_error() -> None:
    r = run_cli("nosuchcommand")
    assert r.exit_code == 2
    assert "No such command" in r.stderr


def _modules_after(*argv: str) -> set[str]:
    code = (
        "import sys\n"
        f"sys.argv = ['moetune', *{list(argv)!r}]\n"
        "from moetune.cli import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "sys.stdout.flush()\n"
        "print('\\n'.join(sys.modules), file=sys.stderr)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(r.stderr.split())


def _heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


def test_help_imports_no_command_module_and_no_heavy_library() -> None:
    mods = _modules_after("--help")
    assert not {m for m in mods if m.startswith("moetune.cli.") and m != "moetune.cli.common"}
    assert not _heavy(mods)


@pytest.mark.parametrize("as_json", [True, False])
def test_inspect_imports_only_what_reading_headers_needs(tmp_path: Path, as_json: bool) -> None:
    g = generate(tmp_path / "m.gguf", "qwen3moe", Dims(n_layer=2), sparse=True)
    mods = _modules_after("inspect", str(g.files[0]), *(["--json"] if as_json else []))
    assert {m.split(".")[0] for m in _heavy(mods)} == (set() if as_json else {"rich"})
    assert not {m for m in mods if m.startswith(("moetune.plan", "moetune.engine", "moetune.bench", "moetune.run"))}
