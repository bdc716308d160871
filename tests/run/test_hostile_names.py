"""Hostile names in the data directory (issue 16): a process name (a layout's service name) names the
files of its run directory, a run id names the directory, a label names a tune's plan file. A name
with '/', '..', a line break or NUL, or one that is a run's own file, must not escape or break the
data directory: it is refused (exit 2, one line naming it) or, for a label, made a file name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moetune.engine import registry
from moetune.engine.launchspec import LaunchSpec, ProcessSpec
from moetune.errors import InputError
from moetune.kinds import LaunchState, ProcessRole, RunKind
from moetune.paths import data_dir, runs_dir
from moetune.run.record import ProcRecord, RunDir, RunInfo
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from moetune.tune.loop import plan_file
from tests.helpers import run_cli

REFUSED = ["../escape", "a/b", "/abs", "..", ".", "", "x\ny", "x\0y", "x\ry", "run", "plan"]
KEPT = ["it's $(touch PWNED) `x`;*", "-rf", "modèles 模型", ".hidden", "a b", "...", "${HOME}"]


def _server(name: str) -> ProcessSpec:
    return ProcessSpec(
        name=name,
        role=ProcessRole.SERVER,
        engine=registry.get().name,
        argv=("-m", "/nonexistent.gguf"),
        host="127.0.0.1",
        port=18080,
    )


def _files_outside(root: Path, keep: Path) -> list[Path]:
    return [p for p in root.rglob("*") if keep not in (p, *p.parents)]


@pytest.mark.parametrize("name", REFUSED, ids=[repr(n) for n in REFUSED])
def test_launch_refuses_a_process_name_that_cannot_name_its_files(tmp_path: Path, name: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"launch": LaunchSpec((_server(name),)).to_json()}))
    before = sorted(tmp_path.parent.rglob("*"))
    r = run_cli("launch", str(plan))
    assert r.exit_code == 2, r.stderr
    first = r.stderr.strip().splitlines()[0]
    assert "cannot name" in first and repr(name) in first, r.stderr
    assert not runs_dir().exists() or list(runs_dir().iterdir()) == []
    assert sorted(tmp_path.parent.rglob("*")) == before
    with pytest.raises(InputError, match="cannot name"):
        LaunchSpec((_server(name),)).validate()


def _run_dir(run: str = "20260101-000000-abcd") -> RunDir:
    info = RunInfo(
        run=run,
        created_at=0.0,
        state=LaunchState.STARTING,
        launch={},
        engines={},
        fingerprint="",
        machine={},
        launcher_pid=0,
        detached=False,
    )
    return RunDir.create(info, {})


def _rec(name: str) -> ProcRecord:
    return ProcRecord(
        name=name,
        role=ProcessRole.SERVER,
        node="local",
        host="127.0.0.1",
        port=1,
        argv=["x"],
        env={},
        env_inherited={},
        log=f"{name}.log",
    )


@pytest.mark.parametrize("name", KEPT, ids=[repr(n) for n in KEPT])
def test_a_process_name_with_shell_characters_names_its_files_inside_the_run(name: str) -> None:
    LaunchSpec((_server(name),)).validate()
    rd = _run_dir()
    rd.add_proc(_rec(name))
    assert rd.log_path(name).parent == rd.path
    assert [r.name for r in rd.procs()] == [name]
    assert rd.info().order == [name] and rd.plan() == {}
    assert _files_outside(data_dir(), rd.path) == [runs_dir()]


@pytest.mark.parametrize("name", REFUSED, ids=[repr(n) for n in REFUSED])
def test_the_run_directory_refuses_such_a_name_too(name: str) -> None:
    rd = _run_dir()
    for call in (lambda: rd.add_proc(_rec(name)), lambda: rd.log_path(name), lambda: rd.proc(name)):
        with pytest.raises(InputError, match="cannot name"):
            call()
    assert json.loads((rd.path / "run.json").read_text())["order"] == []
    assert _files_outside(data_dir(), rd.path) == [runs_dir()]


@pytest.mark.parametrize("run_id", ["..", ".", "../x", "a/b", "x\ny", ""])
def test_a_run_id_that_is_not_one(run_id: str) -> None:
    (data_dir() / "run.json").write_text("{}")  # what `..` would find, were it taken for a run
    with pytest.raises(InputError, match="not a run id"):
        RunDir.open(run_id)
    r = run_cli("stop", run_id)
    assert r.exit_code == 2 and "not a run id" in r.stderr


@pytest.mark.parametrize("label", ["../../x", "..", "a/b", "/abs", "x\ny", "x\0y", "", "it's $(x) `y`;*", "ünï"])
def test_a_label(tmp_path: Path, label: str) -> None:
    """A label is the history's column (any text) and a tune's plan file name (made one)."""
    plan_dir = tmp_path / "plans"
    plan_dir.mkdir()
    path = plan_file(plan_dir, label)
    assert path.parent == plan_dir and path.resolve().parent == plan_dir and "\0" not in str(path)
    path.write_text("{}")
    with ResultsDB.open(tmp_path / "r.sqlite") as db:
        run = db.run(db.create_run(RunMeta(kind=RunKind.BENCH), label=label, target="t"))
        assert run.label == label
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "plans",
        "r.sqlite",
        "r.sqlite-shm",
        "r.sqlite-wal",
    ] or sorted(p.name for p in tmp_path.iterdir()) == ["plans", "r.sqlite"]
