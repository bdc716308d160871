"""Exports in every format, listing, showing, plotting, through the CLI on a filled database."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from moetune.kinds import RunKind
from moetune.store.db import ResultsDB
from moetune.store.record import ModelRef, RunMeta
from tests.bench.synth import run_samples, sample
from tests.helpers import run_cli


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "r.sqlite"
    with ResultsDB.open(path) as db:
        for label, tg in (("cpu-moe", 18.84), ("head+tail", 21.75)):
            meta = RunMeta(
                kind=RunKind.BENCH, argv=("moetune", "bench"), engine_build="b1", model=ModelRef("/m.gguf", "abc")
            )
            rid = db.create_run(meta, label=label, target="http://127.0.0.1:8080")
            db.add_sample(rid, sample(tg=tg * 0.5), phase="warmup")
            for s in run_samples([tg * f for f in (0.999, 1.0, 1.001, 0.998, 1.002)]):
                db.add_sample(rid, s)
            for s in run_samples(
                [tg * 0.97, tg * 0.98, tg * 0.975],
                workload="d4096",
                depth=4096,
                expect_cached=4096,
                cache_n=4096,
                expect_prompt_n=30,
            ):
                db.add_sample(rid, s)
            db.finish_run(rid)
    return path


def test_export_json_keeps_every_raw_sample(db_path: Path) -> None:
    r = run_cli("results", "export", "1", "2", "--format", "json", "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1
    run = doc["runs"][0]
    assert run["meta"]["engine_build"] == "b1" and run["meta"]["schema_version"] == 2
    assert [s["phase"] for s in run["samples"]].count("measure") == 8
    assert run["samples"][0]["phase"] == "warmup"
    assert run["samples"][1]["data"]["timings"]["predicted_n"] == 61
    assert run["derived"]["workloads"]["short-json"]["tg"]["median"] == pytest.approx(18.84)


def test_export_csv_one_row_per_sample_in_si_units(db_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "x" / "runs.csv"
    r = run_cli("results", "export", "--all", "--format", "csv", "-o", str(out), "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == 2 * (1 + 5 + 3)
    m = next(x for x in rows if x["phase"] == "measure")
    assert float(m["tg_tokens_per_s"]) == pytest.approx(18.84 * 0.999)
    assert float(m["predicted_s"]) == pytest.approx(61 / (18.84 * 0.999))
    assert float(m["overhead_s"]) == pytest.approx(0.004)
    assert {"prompt_n", "cached_n", "wall_s", "client_ttft_s"} <= set(m)
    assert [p.name for p in out.parent.iterdir()] == ["runs.csv"]  # written beside, renamed over: no .part left


def test_an_export_that_fails_half_way_leaves_nothing(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno
    from typing import TextIO

    import moetune.report.results_view as rv

    def full_disk(db: object, runs: object, out: TextIO) -> None:
        out.write('{"schema_version": 1, "runs": [')
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rv, "export_json", full_disk)
    out = tmp_path / "runs.json"
    r = run_cli("results", "export", "--all", "--format", "json", "-o", str(out), "--db", str(db_path))
    assert r.exit_code == 2 and "cannot write the export" in r.stderr and "No space left" in r.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("runs.json")]


def test_export_md_and_show_and_list(db_path: Path) -> None:
    md = run_cli("results", "export", "latest", "--format", "md", "--db", str(db_path))
    assert md.exit_code == 0
    assert "## Run 2: head+tail" in md.stdout and "| d4096 |" in md.stdout and "| 4096 |" in md.stdout
    show = run_cli("results", "show", "cpu-moe", "--db", str(db_path))
    assert show.exit_code == 0 and "fingerprint abc" in show.stdout and "d4096" in show.stdout
    js = json.loads(run_cli("results", "show", "1", "--json", "--db", str(db_path)).stdout)
    assert js["samples"] == {"measure": 8, "warmup": 1}
    assert js["derived"]["workloads"]["d4096"]["cache_confirmed"] == 1.0
    lst = json.loads(run_cli("results", "list", "--json", "--db", str(db_path)).stdout)
    assert [x["id"] for x in lst] == [2, 1]
    assert "head+tail" in run_cli("results", "list", "--db", str(db_path)).stdout


def test_show_prints_a_command_that_pastes_back(tmp_path: Path) -> None:
    import shlex

    argv = ("/opt/my tools/moetune", "bench", "http://127.0.0.1:8080", "--label", "1 thread", "-w", "it's $HOME")
    path = tmp_path / "q.sqlite"
    with ResultsDB.open(path) as db:
        db.create_run(
            RunMeta(kind=RunKind.BENCH, argv=argv, launch_run="20260101-100000-aaaa"),
            label="1 thread",
            target="http://127.0.0.1:8080",
        )
    r = run_cli("results", "show", "1", "--db", str(path))
    assert r.exit_code == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("command: ")]
    assert tuple(shlex.split(line.removeprefix("command: "))) == argv
    assert "'1 thread'" in line
    assert "`moetune doctor 20260101-100000-aaaa`" in r.stdout


def test_compare_cli_json_table_and_plot(db_path: Path, tmp_path: Path) -> None:
    r = run_cli("compare", "1", "2", "--json", "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert {(x["run"], x["metric"], x["verdict"]) for x in rows} == {
        (2, "tg:short-json", "faster"),
        (2, "pp:short-json", "same"),
        (2, "tg:d4096", "faster"),
        (2, "pp:d4096", "same"),
    }
    plot = tmp_path / "cmp.png"
    t = run_cli("compare", "2", "--baseline", "1", "--plot", str(plot), "--db", str(db_path))
    assert t.exit_code == 0, t.stderr
    assert "+15.4% faster" in t.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("args", "code", "msg"),
    [
        (("compare", "1"), 2, "at least two runs"),
        (("compare", "1", "9"), 2, "no run 9"),
        (("results", "export", "--format", "md"), 2, "name the runs"),
        (("results", "show", "nope"), 2, "nope"),
    ],
)
def test_bad_input_exits_2(db_path: Path, args: tuple[str, ...], code: int, msg: str) -> None:
    r = run_cli(*args, "--db", str(db_path))
    assert r.exit_code == code and msg in r.stderr


def test_runs_without_a_common_metric(db_path: Path) -> None:
    with ResultsDB.open(db_path) as db:
        rid = db.create_run(RunMeta(kind=RunKind("bench")), label="other", target="t")
        for s in run_samples([20.0, 20.1, 19.9], workload="my-prompt"):
            db.add_sample(rid, s)
    r = run_cli("compare", "1", str(rid), "--db", str(db_path))
    assert r.exit_code == 2 and "nothing to compare: run 3 (other) shares no metric" in r.stderr
    # with a run that does share metrics, that one is compared and the odd one named
    r = run_cli("compare", "1", "2", str(rid), "--db", str(db_path))
    assert r.exit_code == 0, r.stderr
    assert "+15.4% faster" in r.stdout and "head+tail" in r.stdout
    assert "run 3 (other) shares no metric with the baseline run 1 (cpu-moe)" in r.stderr
    assert "not compared" in r.stderr


FIXTURE_V2 = Path(__file__).resolve().parents[1] / "fixtures" / "db" / "results-v2.sqlite"


def test_compare_says_the_kinds_differ(tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "v2.sqlite"
    shutil.copy(FIXTURE_V2, path)
    r = run_cli("compare", "1", "2", "--db", str(path))
    assert r.exit_code == 2
    assert "run 2 (" in r.stderr and "is a serve-bench run and the baseline run 1" in r.stderr
    assert "a bench run" in r.stderr and "one kind" in r.stderr


@pytest.mark.parametrize(
    ("run", "kind", "shows"),
    [
        ("1", "bench", ["model: /models/m.gguf", "short-json"]),
        ("2", "serve-bench", ["server: http://127.0.0.1:8080 (llama.cpp, 2 slots)", "ttft:c=2"]),
        ("3", "link-test", ["link: a -> b at 10.9.0.2:5201", "throughput:8 streams", "rtt"]),
    ],
)
def test_every_kind_of_run_shows_and_exports(tmp_path: Path, run: str, kind: str, shows: list[str]) -> None:
    """results show / export md|csv|json work for every run kind (they crashed on serve-bench and
    link-test runs before the runs shared one record), on a history written by the second release."""
    import shutil

    path = tmp_path / "v2.sqlite"
    shutil.copy(FIXTURE_V2, path)
    r = run_cli("results", "show", run, "--db", str(path))
    assert r.exit_code == 0, r.stderr
    for text in shows:
        assert text in r.stdout
    doc = json.loads(run_cli("results", "show", run, "--db", str(path), "--json").stdout)
    assert doc["run"]["kind"] == kind and doc["meta"]["kind"] == kind
    for fmt in ("md", "csv", "json"):
        e = run_cli("results", "export", run, "--format", fmt, "--db", str(path))
        assert e.exit_code == 0, (fmt, e.stderr)
        assert e.stdout.strip()
    md = run_cli("results", "export", run, "--format", "md", "--db", str(path)).stdout
    assert (f"## Run {run}" in md and "| metric |" in md) or "| workload |" in md
    rows = list(
        csv.DictReader(io.StringIO(run_cli("results", "export", run, "--format", "csv", "--db", str(path)).stdout))
    )
    assert rows and all(row["kind"] == kind for row in rows)
    listed = json.loads(run_cli("results", "list", "--db", str(path), "--json").stdout)
    assert {x["kind"] for x in listed} == {"bench", "serve-bench", "link-test"}


def test_the_list_line_comes_from_what_a_run_stored_when_it_ended(tmp_path: Path) -> None:
    """`results list` reads no samples of a run that ended (a 60,000-request serve-bench run took 20 s
    to read); a run still running is summed up from its samples."""
    from moetune.bench.analysis.summary import run_summary
    from moetune.kinds import RunStatus
    from moetune.report.results_view import headline

    def unread(run_id: int) -> list[dict[str, object]]:
        raise AssertionError(f"run {run_id}'s samples were read")

    with ResultsDB.open(tmp_path / "h.sqlite") as db:
        done = db.create_run(RunMeta(kind=RunKind.BENCH), label="b", target="t")
        for s in run_samples([20.0, 22.0, 21.0]):
            db.add_sample(done, s)
        db.finish_run(done, RunStatus.DONE, run_summary(db.samples(done)))
        serve = db.create_run(RunMeta(kind=RunKind.SERVE_BENCH), label="s", target="t")
        db.finish_run(
            serve,
            RunStatus.DONE,
            {"levels": [{"concurrency": 4, "rate": None, "ttft_ms": {"p50": 123.4}, "tpot_ms": {"p50": 45.6}}]},
        )
        running = db.create_run(RunMeta(kind=RunKind.BENCH), label="r", target="t")
        for s in run_samples([10.0, 12.0]):
            db.add_sample(running, s)
        assert headline(db.run(done), unread) == "tg:short-json 21.00, pp:short-json 25.00"
        assert headline(db.run(serve), unread) == "ttft:c=4 123.4, tpot:c=4 45.60"
        assert headline(db.run(running), db.iter_samples) == "tg:short-json 11.00, pp:short-json 25.00"
