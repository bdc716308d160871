"""Shared fixtures: moetune's data directory points into a temporary one for every test; the
engine build (cache) is shared, since building llama.cpp takes minutes. No test leaves a process
behind (tests/process_guard.py): a test whose launches outlive it errors, and the session fails
naming any process of its own still alive at the end."""

from __future__ import annotations

import os
import secrets
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import engine_bin_dir
from tests.process_guard import SESSION_ENV, find_strays, kill, report, run_ids


def pytest_configure(config: pytest.Config) -> None:
    # every process the tests start inherits this; the session's end looks for it
    os.environ[SESSION_ENV] = f"{os.getpid()}-{secrets.token_hex(6)}"
    # the suite shares its machine with other jobs (and its own servers run side by side): their load
    # would flag every run contended and stop every tune; the tests of that set it back themselves
    # (tests/test_contention_server.py)
    os.environ.setdefault("MOETUNE_MAX_FOREIGN_CORES", "off")
    # a suite started in the background of a script without job control inherits SIGINT ignored, and
    # so would every process it starts: the Ctrl-C tests would then see nothing stop. A handler is
    # reset to the default at exec, so the children get a working SIGINT again.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def no_process_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    left = find_strays(os.environ.get(SESSION_ENV), run_ids(tmp_path_factory.getbasetemp()))
    if left:
        kill(left)
        pytest.fail(report(left, "the test session"), pytrace=False)


@pytest.fixture(autouse=True)
def moetune_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("moetune-data")
    monkeypatch.setenv("MOETUNE_DATA_DIR", str(home))
    # plans made by the tests' commands keep CPU weight repacking off (`--repack off`): on an AVX-512
    # CPU with AMX the mainline build crashes at load with repacked quantized weights (DESIGN.md
    # section 5; `moetune doctor`'s repack_crash). A test about repacking sets --repack or deletes this.
    monkeypatch.setenv("MOETUNE_REPACK", "off")
    yield home
    left = find_strays(None, run_ids(home))  # launches the test started and did not stop, failed or not
    if left:
        kill(left)
        pytest.fail(report(left, "this test"), pytrace=False)


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    d = engine_bin_dir()
    if d is None:
        pytest.fail("llama.cpp is not built: run `make test` (it runs `moetune engine install` first)")
    return d


@pytest.fixture(scope="session")
def ik_bin_dir() -> Path:
    from moetune.engine.install import IK

    d = engine_bin_dir(IK)
    if d is None:
        pytest.fail("ik_llama.cpp is not built: run `make test` (it runs `moetune engine install --kind ik_llama.cpp`)")
    return d


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the session's generated models share."""
    return tmp_path_factory.mktemp("models")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="needs root for ip netns")
        for item in items:
            if "netns" in item.keywords:
                item.add_marker(skip)
