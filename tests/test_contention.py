"""The CPU accounting of a run (moetune.contention) on readings in the kernel's own format: the engine's
time (its processes and their children), moetune's own, and everything else; the thresholds; the
flags a run carries; and the tune's gate on a machine that is or is not busy."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import pytest

from moetune import contention as c
from moetune import procfs
from moetune.errors import InputError, MachineBusy
from moetune.kinds import RunKind
from moetune.store.db import ResultsDB
from moetune.store.record import RunMeta
from moetune.tune.quiet import QuietGate, foreign_load

TCK = 100


def stat_line(pid: int, comm: str, ppid: int, ticks: int, start: int = 1000) -> str:
    """A /proc/PID/stat line: utime ``ticks``, stime 0."""
    rest = [
        "R",
        str(ppid),
        str(pid),
        str(pid),
        "0",
        "-1",
        "4194304",
        "10",
        "0",
        "2",
        "0",
        str(ticks),
        "0",
        "0",
        "0",
        "20",
        "0",
        "4",
        "0",
        str(start),
        "1000000",
        "250",
    ]
    return f"{pid} ({comm}) " + " ".join(rest)


def census(
    t: float, busy: int, procs: dict[int, tuple[str, int, int]], cores: int = 2, start: dict[int, int] | None = None
) -> c.Census:
    """``busy`` ticks over all cores; ``procs``: pid -> (comm, ppid, cpu ticks)."""
    stats: dict[int, procfs.ProcStat] = {}
    for pid, (comm, ppid, ticks) in procs.items():
        st = procfs.parse_proc_stat(stat_line(pid, comm, ppid, ticks, (start or {}).get(pid, 1000)))
        assert st is not None
        stats[pid] = st
    return c.Census(t, busy, cores, stats)


def test_proc_stat_reads_the_command_and_parent() -> None:
    st = procfs.parse_proc_stat(stat_line(42, "llama (srv) x", 7, 55))
    assert st is not None and (st.comm, st.ppid, st.cpu_ticks) == ("llama (srv) x", 7, 55)


def test_split_counts_the_engine_with_its_children_moetune_apart_and_the_rest_as_foreign() -> None:
    # over 2 s on 2 cores (400 ticks): the server 150 ticks (its child 30), moetune 20, a hog 160,
    # and 10 ticks the kernel spent in interrupts (in no process)
    before = census(
        0.0,
        1000,
        {1: ("systemd", 0, 5), 100: ("moetune", 1, 50), 200: ("llama-server", 100, 400), 300: ("python3", 1, 0)},
    )
    after = census(
        2.0,
        1000 + 370,
        {
            1: ("systemd", 0, 5),
            100: ("moetune", 1, 70),
            200: ("llama-server", 100, 550),
            201: ("child", 200, 30),
            300: ("python3", 1, 160),
        },
    )
    s = c.split(before, after, engine_roots=[200], client=[100], clk_tck=TCK)
    assert s.seconds == 2.0 and s.machine == pytest.approx(3.7)
    assert s.engine == pytest.approx(1.8)  # 150 + the child's 30 (new since the last reading: all of its time)
    assert s.client == pytest.approx(0.2)  # moetune's own process, not its child the server
    assert s.foreign == pytest.approx(1.7)  # the hog's 1.6 and 0.1 that no process carries
    assert s.by_process == {("python3", 300): pytest.approx(1.6)}


def test_a_reused_pid_is_a_new_process() -> None:
    before = census(0.0, 0, {300: ("old", 1, 500)})
    after = census(1.0, 80, {300: ("new", 1, 80)}, start={300: 2000})
    s = c.split(before, after, (), (), clk_tck=TCK)
    assert s.by_process == {("new", 300): pytest.approx(0.8)}


def test_foreign_load_is_never_negative() -> None:
    # the process counters ran a little ahead of /proc/stat
    before = census(0.0, 0, {200: ("llama-server", 1, 0)})
    after = census(1.0, 95, {200: ("llama-server", 1, 100)})
    assert c.split(before, after, [200], (), clk_tck=TCK).foreign == 0.0


def tally_of(*intervals: tuple[float, dict[tuple[str, int], float], float], seen: bool = True) -> c.Tally:
    t = c.Tally()
    for seconds, by, engine in intervals:
        t.add(
            c.Split(
                seconds=seconds,
                cores=2,
                machine=engine + sum(by.values()),
                engine=engine,
                client=0.05,
                foreign=sum(by.values()),
                by_process=by,
                engine_seen=seen,
            )
        )
    return t


def test_a_run_is_contended_above_the_threshold_and_names_the_top_commands() -> None:
    t = tally_of(
        (1.0, {("python3", 11): 0.9, ("python3", 12): 0.8, ("cc1", 40): 0.1}, 1.0),
        (1.0, {("python3", 11): 0.9, ("python3", 12): 0.9}, 1.0),
    )
    r = t.result(0.5)
    assert r is not None and r.contended
    assert r.foreign_cores == pytest.approx(1.8) and r.foreign_peak_cores == pytest.approx(1.8)
    assert r.top[0].comm == "python3" and r.top[0].pids == (11, 12) and r.top[0].cores == pytest.approx(1.75)
    assert r.top[1] == c.ForeignLoad("cc1", (40,), pytest.approx(0.05))
    msg = r.message()
    assert "foreign load 1.80 cores" in msg and "python3 (pids 11, 12) 1.75 cores (88% of the machine)" in msg
    assert c.Contention.from_json(r.to_json()) == r  # as stored with the run
    assert not t.result(2.0).contended and not t.result(None).contended  # type: ignore[union-attr]
    assert c.Tally().result(0.5) is None  # nothing measured


def test_a_run_whose_engine_is_not_on_this_machine_is_not_judged() -> None:
    # a URL served elsewhere (or by a process this user cannot see): its time would read as foreign
    t = tally_of((2.0, {("python3", 11): 3.0}, 0.0), seen=False)
    r = t.result(0.5)
    assert r is not None and not r.judged and not r.contended and "not seen on this machine" in r.message()
    assert c.Contention.from_json(r.to_json()) == r
    assert t.result(0.5, engine=False).contended  # type: ignore[union-attr]  # no engine expected: the gate's


def test_a_short_run_is_judged_from_the_reading_seconds_before_its_end() -> None:
    rs = [census(float(t), 0, {}) for t in (0, 1, 2, 3)]  # the last: the run's first reading
    assert c.lead(rs, 2.5) is rs[0] and c.lead(rs, 1.5) is rs[1] and c.lead(rs, 1.0) is rs[2]
    assert c.lead(rs, 9.0) is rs[0]  # the oldest there is
    assert c.lead(rs, 0.0) is None and c.lead(rs[-1:], 2.0) is None  # long enough; nothing before


def test_a_run_of_a_fraction_of_a_second_beside_a_hog_is_contended(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the 0.3 s the run measured, the woken engine took both cores and the hog got 0.2 (CI
    measured 0.44 cores for two hogs over 0.5 s once): judged with the seconds before, it is contended."""
    from moetune.monitor.sampler import RunMonitor, Watch

    tck = procfs.CLK_TCK
    # (time, hog's ticks, engine's ticks): the hog on both cores until the run, then 0.2 cores
    script = iter(
        [
            (0.0, 0, 0),
            (1.0, 2 * tck, 0),
            (2.0, 4 * tck, 0),
            (3.0, 6 * tck, 0),
            (3.3, 6 * tck + tck // 50 * 3, 6 * tck // 10),
        ]
    )

    def reading() -> c.Census:
        t, hog, engine = next(script)
        return census(t, hog + engine, {9: ("cpu-hog", 1, hog), 20: ("llama-server", 1, engine)})

    monkeypatch.setattr(c, "census", reading)
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "0.5")
    mon = RunMonitor(lambda: [Watch(name="main", role="server", pid=20)], interval_s=0)
    for _ in range(3):
        mon.sampler.count_cpu()  # the sampler's ticks while the server loaded
    mon.sink.attach = lambda *a: None  # type: ignore[method-assign]  # no database here
    mon.attach(None, 1)
    r = mon.cpu_contention()
    assert r is not None and r.contended and r.seconds == pytest.approx(3.3)
    assert r.foreign_cores == pytest.approx((6 + 0.06) / 3.3, abs=0.01) and r.top[0].comm == "cpu-hog"
    run_only = mon.sampler.tally
    assert run_only is not None and run_only.seconds == pytest.approx(0.3)  # the run's own tally unchanged
    assert not run_only.result(0.5).contended  # type: ignore[union-attr]  # alone, it would pass


@pytest.mark.parametrize("limit", ["0.5", "off"])
def test_a_short_run_after_a_fast_launch_is_judged_with_the_seconds_after_it(
    monkeypatch: pytest.MonkeyPatch, limit: str
) -> None:
    """A server up in 0.5 s and a 0.3 s run: the readings before reach back 0.5 s, so the rest of
    the 3 s is waited for after the run (the engine idle, the hog on both cores); not with the
    threshold off (nothing is judged, nobody waits)."""
    from moetune.monitor import sampler as sm

    tck = procfs.CLK_TCK
    clock = {"t": 0.0}
    hog_at = {0.0: 0, 0.5: tck, 0.8: tck + tck // 50 * 3, 3.0: tck + tck // 50 * 3 + 2 * tck * 22 // 10}

    engine_at = {0.0: 0, 0.5: 0, 0.8: 6 * tck // 10, 3.0: 6 * tck // 10}  # both cores while it ran

    def reading() -> c.Census:
        t = round(clock["t"], 3)
        return census(
            t, hog_at[t] + engine_at[t], {9: ("cpu-hog", 1, hog_at[t]), 20: ("llama-server", 1, engine_at[t])}
        )

    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock["t"] += s

    monkeypatch.setattr(c, "census", reading)
    monkeypatch.setattr(sm.time, "sleep", sleep)
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", limit)
    mon = sm.RunMonitor(lambda: [sm.Watch(name="main", role="server", pid=20)], interval_s=0)
    mon.sampler.count_cpu()  # the sampler's first tick, as the launch began
    clock["t"] = 0.5
    mon.sink.attach = lambda *a: None  # type: ignore[method-assign]
    mon.attach(None, 1)
    clock["t"] = 0.8
    r = mon.cpu_contention()
    assert r is not None
    if limit == "off":
        assert slept == [] and r.seconds == pytest.approx(0.8) and not r.contended
    else:
        assert slept == [pytest.approx(2.2)] and r.seconds == pytest.approx(3.0)
        assert r.contended and r.foreign_cores > 1.5 and r.top[0].comm == "cpu-hog"


@pytest.mark.parametrize(
    ("raw", "cores", "limit"), [("", 2, 0.5), ("1.5", 2, 1.5), ("25%", 16, 4.0), ("off", 2, None), ("OFF", 8, None)]
)
def test_the_threshold_in_cores_or_a_share_of_the_machine(raw: str, cores: int, limit: float | None) -> None:
    assert c.max_foreign_cores(cores, raw) == limit


@pytest.mark.parametrize("raw", ["lots", "-1", "x%"])
def test_a_bad_threshold_is_an_input_error(raw: str) -> None:
    with pytest.raises(InputError, match="MOETUNE_MAX_FOREIGN_CORES"):
        c.max_foreign_cores(2, raw)


def summary(tg: tuple[float, float, float], pp: tuple[float, float, float]) -> dict[str, Any]:
    def s(x: tuple[float, float, float]) -> dict[str, float]:
        return {"median": x[0], "ci_low": x[1], "ci_high": x[2]}

    return {"workloads": {"d0": {"tg": s(tg), "pp": s(pp)}}}


def test_noisy_when_an_interval_is_wider_than_the_limit() -> None:
    # the busy run: TG 9.3 tok/s, interval 5.6-21.1
    assert c.noisy_figures(summary((9.3, 5.6, 21.1), (1000, 990, 1010)), 10) == ("tg:d0 +/-83%",)
    assert c.noisy_figures(summary((325, 320, 331), (1000, 990, 1010)), 10) == ()
    assert c.noisy_limit_pct("") == 10.0 and c.noisy_limit_pct("25") == 25.0
    flags = c.run_flags(None, summary((9.3, 5.6, 21.1), (1000, 990, 1010)), 10)
    assert flags.markers == ("noisy",) and not flags.contended


def test_the_flags_of_a_stored_run(tmp_path: Any) -> None:
    busy = tally_of((2.0, {("python3", 11): 3.0}, 1.0)).result(0.5)
    with ResultsDB.open(tmp_path / "r.db") as db:
        rid = db.create_run(RunMeta(kind=RunKind.BENCH), label="x", target="t")
        db.finish_run(rid, summary=summary((100, 99, 101), (500, 499, 501)))
        assert db.run(rid).contention is None and db.run(rid).flags().markers == ()
        db.set_contention(rid, busy)
        run = db.run(rid)
        assert run.contention == busy and run.flags().markers == ("contended",)
        assert run.header()["contended"] is True and run.to_json()["flags"]["contention"]["top"][0]["pids"] == [11]


HOG = "import ctypes; ctypes.CDLL(None).prctl(15, b'cpu-hog', 0, 0, 0)\nwhile True: pass"  # PR_SET_NAME


def hogs(n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` processes spinning on a core each, named ``cpu-hog``; the caller kills them."""
    return [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n)]


def kill(ps: list[subprocess.Popen[bytes]]) -> None:
    for p in ps:
        p.kill()
        p.wait()


def threshold_above_the_background(monkeypatch: pytest.MonkeyPatch, seconds: float = 30.0) -> float:
    """Set the threshold half a core above what the machine's other jobs take now (this suite shares
    its machine), at least the default 0.5: two hogs on this machine's 2 cores pass it, their end
    falls below it. Skip when the other jobs leave no room for that (a build on both cores)."""
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "0.5")  # on, to measure
    ends, seen = time.monotonic() + seconds, 0.0
    while time.monotonic() < ends:
        got = foreign_load(1.0)
        assert got is not None
        if got.foreign_cores < 1.0:
            limit = max(0.5, round(got.foreign_cores + 0.5, 2))
            monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", str(limit))
            return limit
        seen = got.foreign_cores
    pytest.skip(f"the machine's other jobs keep it busy ({seen:.2f} cores): a quiet machine cannot be waited for")


def test_the_gate_stops_a_search_on_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "0.5")
    hog = hogs(2)
    try:
        time.sleep(0.3)
        with pytest.raises(MachineBusy) as e:
            QuietGate(print, window_s=1.0).before_launch()
        assert e.value.exit_code == 3 and "cpu-hog (pids" in str(e.value) and str(hog[0].pid) in str(e.value)
        assert "--wait-quiet" in (e.value.hint or "")
    finally:
        kill(hog)


def test_with_wait_quiet_the_gate_waits_for_the_hog_to_end(monkeypatch: pytest.MonkeyPatch) -> None:
    threshold_above_the_background(monkeypatch)
    said: list[str] = []
    hog = hogs(2)
    try:
        ends = time.monotonic() + 2.5

        def sleep(s: float) -> None:  # the hogs end while the search waits
            time.sleep(s)
            if time.monotonic() > ends:
                kill(hog)

        QuietGate(said.append, wait_s=30.0, window_s=1.0, sleep=sleep).before_launch()
        assert any("waiting for the machine to go quiet" in s and "cpu-hog" in s for s in said), said
        assert "the machine is quiet" in said[-1]
    finally:
        kill(hog)


def test_the_gate_is_open_when_the_threshold_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "off")
    QuietGate(print, sleep=lambda s: pytest.fail("no window is measured")).before_launch()
    assert os.environ["MOETUNE_MAX_FOREIGN_CORES"] == "off"


def test_compare_marks_a_flagged_run_and_says_why() -> None:
    from moetune.bench.analysis.stats import MetricSamples
    from moetune.report.compare import RunMetrics, compare
    from moetune.report.compare_view import comparison_markdown

    ms = {"tg:d0": MetricSamples(values=(100.0, 101.0, 99.0), higher_is_better=True)}
    base = RunMetrics(run=1, label="quiet", kind="bench", status="done", metrics=ms)
    busy = RunMetrics(
        run=2,
        label="busy",
        kind="bench",
        status="done",
        metrics={"tg:d0": MetricSamples(values=(50.0, 60.0, 40.0), higher_is_better=True)},
        flags=("contended",),
        flag_notes=("run 2 (busy): contended: foreign load 1.80 cores ...",),
    )
    comp = compare(base, [busy])
    assert comp.to_json()["run_flags"] == {"2": ["contended"]}
    assert "run 2 (busy): contended: foreign load" in comp.notes[0]
    assert "| busy [contended] | 2 |" in comparison_markdown(comp)


def test_a_calibration_worse_than_the_built_in_constants_is_not_applied() -> None:
    from moetune.plan.calibrate import UNCALIBRATED_PCT, Calibration, not_applicable
    from moetune.plan.speed import SpeedConstants

    def cal(tg: float, pp: float) -> Calibration:
        return Calibration(
            constants=SpeedConstants(),
            runs=(1, 2),
            observations=4,
            loo_tg_median_abs_pct=80.0,
            loo_pp_median_abs_pct=10.0,
            before_tg_median_abs_pct=30.0,
            before_pp_median_abs_pct=30.0,
            uncertainty_tg_pct=tg,
            uncertainty_pp_pct=pp,
        )

    assert not_applicable(cal(12.0, UNCALIBRATED_PCT)) is None  # no PP measured: the built-in band
    why = not_applicable(cal(160.0, 20.0))
    assert why is not None and "TG +/-160%" in why and "+/-50%" in why


def test_a_contended_measurement_stops_the_search_or_is_measured_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MOETUNE_MAX_FOREIGN_CORES", "off")  # the window before the next launch: quiet
    busy = tally_of((2.0, {("cpu-hog", 11): 3.0}, 1.0)).result(0.5)
    with ResultsDB.open(tmp_path / "r.db") as db:
        rid = db.create_run(RunMeta(kind=RunKind.BENCH), label="x", target="t")
        quiet = db.create_run(RunMeta(kind=RunKind.BENCH), label="y", target="t")
        db.set_contention(rid, busy)
        with pytest.raises(MachineBusy, match=rf"run {rid} was contended while it measured: .*cpu-hog \(pid 11\)"):
            QuietGate(print).accept(db, rid)
        said: list[str] = []
        gate = QuietGate(said.append, wait_s=10.0)
        assert gate.accept(db, quiet) and gate.accept(db, None)
        assert [gate.accept(db, rid) for _ in range(3)] == [False] * 3  # measured again, each time
        assert "it is measured again once the machine is quiet" in said[0]
        with pytest.raises(MachineBusy):  # but not for ever
            gate.accept(db, rid)
