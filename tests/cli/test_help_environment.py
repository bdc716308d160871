"""`moetune --help` lists every environment variable moetune reads."""

from __future__ import annotations

import re
from pathlib import Path

import moetune
from moetune.cli import ENVIRONMENT
from moetune.run.remote import SSH_ENV
from tests.helpers import run_cli


def read_by_moetune() -> set[str]:
    src = Path(moetune.__file__).parent
    found = {m for f in src.rglob("*.py") for m in re.findall(r'environ\.get\("(MOETUNE_\w+)"', f.read_text())}
    return found | {SSH_ENV}


def test_help_lists_the_environment_variables_moetune_reads() -> None:
    assert read_by_moetune() >= {"MOETUNE_DATA_DIR", "MOETUNE_CACHE_DIR", "MOETUNE_ENGINE", "MOETUNE_SSH_COMMAND"}
    assert {name for name, _ in ENVIRONMENT} == read_by_moetune()
    r = run_cli("--help")
    assert r.exit_code == 0
    env = r.stdout.split("Environment:", 1)[1]
    for name, _ in ENVIRONMENT:
        assert re.search(rf"^  {name} ", env, re.M), name
