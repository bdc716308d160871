"""Soak: `moetune serve-bench` at 256 concurrent streams against the mock server for 30 minutes.

The client is the product as a user runs it: ``python -m moetune serve-bench URL -C 256 --duration
1800`` in its own process, storing every request in a fresh history. The mock
(``tests.bench.mock_server``, another process) writes tokens on a known schedule and records when
it wrote each. Every few seconds this bench, a third process:

- samples the client: RSS, open file descriptors (``/proc/PID/fd``), threads and CPU;
- takes the requests the mock finished (``/mock/log/drain``: its receipt of each and the time of
  each write) and the samples the client stored since the last look (the history's rows), pairs
  them by response id, and scores what serve-bench reports against what the mock did
  (:func:`benchmarks.serve_accuracy.request_errors`), per time window of the run.

At the end: every request the mock answered must have exactly one stored sample (none lost), the
client's own count of requests done (its load meter, in the run's last metrics snapshot) must
equal the rows stored, and RSS, descriptors and the error must not drift (least-squares slope
over the steady part of the run against a stated threshold).

Length: ``SOAK_MINUTES`` (default 30; `make bench` runs the full length) or ``--minutes``;
streams: ``SOAK_STREAMS`` or ``--streams`` (default 256). Writes results/soak.json (the time
series and the windows) and results/soak.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # run as a script: the benches share `benchmarks.*` and `tests.*`
    sys.path.insert(0, str(HERE.parent))

from benchmarks.serve_accuracy import request_errors  # noqa: E402
from tests.bench.mock_server import MockConfig, mock_server  # noqa: E402

DEFAULT_MINUTES = 30.0
DEFAULT_STREAMS = 256
SAMPLE_S = 5.0  # the client is sampled, and the mock's log drained, this often
WINDOWS = 10  # the run's error is scored in this many time windows (at least 30 s each)
OUTPUT_TOKENS = 128
INPUT_TOKENS = 64
# the mock's schedule: TTFT 100-300 ms, ITL 40-80 ms (mean 60 ms): at 256 streams about 4,200 tokens/s,
# each written and timed by one Python process on a 2-core machine shared with other work
MOCK = MockConfig(ttft_ms=(100.0, 150.0, 200.0, 250.0, 300.0), itl_ms=(40.0, 50.0, 60.0, 70.0, 80.0))
STEADY_AFTER = 0.1  # slopes skip the first 10% of the level (at least one minute): connections and prompts
STEADY_MIN_S = 60.0
# verdicts: flat when the steady slope stays under these
RSS_FLAT_MIB_PER_H = 8.0
FDS_FLAT_PER_H = 1.0
THREADS_FLAT_PER_H = 1.0
ERROR_DRIFT_MS_PER_H = 0.1  # slope of the windows' median ITL and TTFT error
CLOSE_AFTER_S = 60.0  # a window is scored once a request sent this long after its end is stored
WORST = 5


@dataclass
class Window:
    """One time window's errors (ms), by the request's send time."""

    start_s: float
    end_s: float
    requests: int = 0
    errors: int = 0
    ttft: array = field(default_factory=lambda: array("d"))
    itl: array = field(default_factory=lambda: array("d"))
    lag: array = field(default_factory=lambda: array("d"))
    late: array = field(default_factory=lambda: array("d"))
    done: dict[str, Any] | None = None  # the figures, once the window is closed and its samples let go

    def close(self) -> dict[str, Any]:
        if self.done is None:
            self.done = self._figures()
            self.ttft, self.itl, self.lag, self.late = array("d"), array("d"), array("d"), array("d")
        return self.done

    def _figures(self) -> dict[str, Any]:
        return {
            "start_s": round(self.start_s, 1),
            "end_s": round(self.end_s, 1),
            "requests": self.requests,
            "errors": self.errors,
            "events": len(self.lag),
            "ttft_err_over_1ms": sum(1 for x in self.ttft if x > 1.0),
            "itl_err_over_1ms": sum(1 for x in self.itl if x > 1.0),
            "ttft_err_ms": _dist(self.ttft),
            "itl_err_ms": _dist(self.itl),
            "lag_ms": _dist(self.lag),
            "mock_late_ms": _dist(self.late),
        }


def _dist(xs: array) -> dict[str, float | None]:
    if not len(xs):
        return {"p50": None, "p90": None, "p99": None, "max": None}
    a = np.frombuffer(xs, dtype=float)
    q = np.percentile(a, (50, 90, 99))
    return {
        "p50": round(float(q[0]), 4),
        "p90": round(float(q[1]), 4),
        "p99": round(float(q[2]), 4),
        "max": round(float(a.max()), 4),
    }


CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc(pid: int) -> dict[str, float] | None:
    """RSS (MiB), open descriptors, threads and CPU seconds of a live process; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if "VmRSS" not in fields:  # a zombie: exited, not yet reaped
        return None
    rest = stat.rsplit(")", 1)[1].split()
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "fds": fds,
        "threads": int(fields["Threads"]),
        "cpu_s": (int(rest[11]) + int(rest[12])) / CLK_TCK,
    }


DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the mock is on 127.0.0.1: no proxy


def _get(url: str) -> Any:
    with DIRECT.open(url, timeout=30) as r:
        return json.loads(r.read())


def _slope_per_h(ts: list[float], ys: list[float]) -> float | None:
    if len(ts) < 3 or ts[-1] <= ts[0]:
        return None
    return float(np.polyfit(np.asarray(ts) / 3600, np.asarray(ys, dtype=float), 1)[0])


class Scorer:
    """Pairs the mock's finished requests with the client's stored samples, scores each pair into
    its window, and counts what was stored."""

    def __init__(self, db: Path, window_s: float, n_windows: int) -> None:
        self.db = db
        self.level_t0: float | None = None  # when the level began (its first request was due), monotonic
        self.windows = [Window(i * window_s, (i + 1) * window_s) for i in range(n_windows)]
        self.window_s = window_s
        self.mock: dict[str, tuple[float, list[float]]] = {}  # response id -> (receipt, writes), awaiting a sample
        self.client: dict[str, tuple[str, dict[str, Any]]] = {}  # response id -> (phase, sample), awaiting the mock
        self.conn: sqlite3.Connection | None = None
        self.last_row = 0
        self.stored: dict[str, int] = {}
        self.matched = 0
        self.duplicates = 0
        self.no_response_id = 0
        self.run_id: int | None = None
        self.last_send = 0.0  # the latest send time stored, from the level's start
        self.worst: list[
            dict[str, Any]
        ] = []  # the requests with the largest TTFT error: what the client saw and the mock did

    def add_mock(self, log: dict[str, dict[str, Any]]) -> None:
        for cid, e in log.items():
            if cid in self.client:
                self._score(cid, *self.client.pop(cid), e["recv"], e["writes"])
            else:
                self.mock[cid] = (e["recv"], e["writes"])

    def read_samples(self) -> None:
        if self.conn is None:
            if not self.db.exists():
                return
            self.conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=30)
        try:
            rows = self.conn.execute(
                "SELECT id, run_id, phase, data FROM samples WHERE id > ? ORDER BY id", (self.last_row,)
            ).fetchall()
        except sqlite3.OperationalError:  # not migrated yet
            return
        for row_id, run_id, phase, data in rows:
            self.last_row = row_id
            self.run_id = run_id
            self.stored[phase] = self.stored.get(phase, 0) + 1
            s = json.loads(data)
            cid = s.get("response_id")
            if phase == "measure" and self.level_t0 is None:
                self.level_t0 = float(s["t_sched"])
            if not cid:
                self.no_response_id += 1
                if phase == "measure":
                    self._window(s).errors += 1
            elif cid in self.client:
                self.duplicates += 1
            elif cid in self.mock:
                self._score(cid, phase, s, *self.mock.pop(cid))
            else:
                self.client[cid] = (phase, s)
            if phase == "measure" and self.level_t0 is not None and s.get("t_send"):
                self.last_send = max(self.last_send, float(s["t_send"]) - self.level_t0)
        for w in self.windows:  # a window's requests have all ended a minute after its last was sent
            if w.done is None and w.end_s + CLOSE_AFTER_S < self.last_send:
                w.close()

    def _window(self, s: dict[str, Any]) -> Window:
        assert self.level_t0 is not None
        t = float(s.get("t_send") or s.get("t_sched")) - self.level_t0
        return self.windows[min(max(int(t // self.window_s), 0), len(self.windows) - 1)]

    def _score(self, cid: str, phase: str, s: dict[str, Any], recv: float, writes: list[float]) -> None:
        self.matched += 1
        if phase != "measure":
            return
        w = self._window(s)
        w.requests += 1
        if s.get("error"):
            w.errors += 1
            return
        no = int(cid.rsplit("-", 1)[1])
        due = [recv + d for d in MOCK.token_times(no, len(writes))]
        e = request_errors(s, recv, writes, due)
        if e.ttft_err_ms is not None:
            w.ttft.append(e.ttft_err_ms)
            if len(self.worst) < WORST or e.ttft_err_ms > self.worst[-1]["ttft_err_ms"]:
                events = [c for c in s["chunks"] if (c[1] or 0) > 0][:6]
                self.worst = sorted(
                    [
                        *self.worst,
                        {
                            "ttft_err_ms": round(e.ttft_err_ms, 3),
                            "response_id": cid,
                            "t_send": s["t_send"],
                            "mock_recv": recv,
                            "mock_writes": writes[:6],
                            "client_events": [
                                {"t": c[0], "earliest": c[5] if len(c) > 5 else None, "server_ms": c[4]} for c in events
                            ],
                        },
                    ],
                    key=lambda x: -x["ttft_err_ms"],
                )[:WORST]
        w.itl.extend(e.itl_err_ms)
        w.lag.extend(e.lag_ms)
        w.late.extend(e.late_ms)

    def last_snapshot(self) -> dict[str, Any] | None:
        if self.conn is None or self.run_id is None:
            return None
        row = self.conn.execute(
            "SELECT data FROM metrics WHERE run_id = ? ORDER BY t DESC, id DESC LIMIT 1", (self.run_id,)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def soak(minutes: float, streams: int, log: Any = print) -> dict[str, Any]:
    duration_s = minutes * 60
    n_windows = max(1, min(WINDOWS, int(duration_s // 30)))
    window_s = duration_s / n_windows
    series: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="moetune-soak-") as tmp, mock_server(MOCK) as url:
        db = Path(tmp) / "soak.sqlite"
        env = {**os.environ, "MOETUNE_DATA_DIR": str(Path(tmp) / "data"), "MOETUNE_CACHE_DIR": str(Path(tmp) / "cache")}
        argv = [
            sys.executable,
            "-m",
            "moetune",
            "serve-bench",
            url,
            "--concurrency",
            str(streams),
            "--duration",
            f"{duration_s:g}",
            "--input-len",
            str(INPUT_TOKENS),
            "--output-len",
            str(OUTPUT_TOKENS),
            "--timeout",
            "120",
            "--label",
            "soak",
            "--db",
            str(db),
            "--json",
        ]
        mock_pid = int(_get(url + "/mock/stats")["pid"])
        out_path, err_path = Path(tmp) / "stdout.json", Path(tmp) / "stderr.txt"
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            t0 = time.monotonic()
            client = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        scorer = Scorer(db, window_s, n_windows)
        prev: dict[int, tuple[float, float]] = {}

        def cpu_pct(pid: int, p: dict[str, float] | None, now: float) -> float | None:
            if p is None:
                return None
            last = prev.get(pid)
            prev[pid] = (now, p["cpu_s"])
            return None if last is None else round((p["cpu_s"] - last[1]) / (now - last[0]) * 100, 1)

        try:
            next_t = t0
            while True:
                now = time.monotonic()
                p = _proc(client.pid)
                m = _proc(mock_pid)
                scorer.add_mock(_get(url + "/mock/log/drain"))
                scorer.read_samples()
                stats = _get(url + "/mock/stats")
                if p is not None:
                    row = {
                        "t_s": round(now - t0, 2),
                        "rss_mib": round(p["rss_mib"], 2),
                        "fds": int(p["fds"]),
                        "threads": int(p["threads"]),
                        "cpu_pct": cpu_pct(client.pid, p, now),
                        "mock_cpu_pct": cpu_pct(mock_pid, m, now),
                        "mock_rss_mib": m and round(m["rss_mib"], 1),
                        "stored": sum(scorer.stored.values()),
                        "mock_completed": stats["completed"],
                        "load1": round(os.getloadavg()[0], 2),
                    }
                    series.append(row)
                    if len(series) % max(1, int(60 / SAMPLE_S)) == 1:
                        log(
                            f"soak {row['t_s']:7.0f} s: RSS {row['rss_mib']:7.1f} MiB, {row['fds']} fds, "
                            f"{row['threads']} threads, CPU {row['cpu_pct']}%, mock CPU {row['mock_cpu_pct']}%, "
                            f"{row['stored']} stored / {row['mock_completed']} answered, load {row['load1']}"
                        )
                if client.poll() is not None:
                    break
                next_t += SAMPLE_S
                time.sleep(max(0.0, next_t - time.monotonic()))
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
        wall_s = time.monotonic() - t0
        scorer.add_mock(_get(url + "/mock/log/drain"))
        scorer.read_samples()
        stats = _get(url + "/mock/stats")
        snap = scorer.last_snapshot()
        scorer.close()
        stderr = err_path.read_text(errors="replace")
        if client.returncode != 0:
            raise RuntimeError(f"serve-bench exited {client.returncode}: {stderr[-2000:]}")
        doc = json.loads(out_path.read_text())
        db_bytes = db.stat().st_size + sum(f.stat().st_size for f in Path(tmp).glob("soak.sqlite-*"))
    level = doc["levels"][0]
    counts = {
        "client_done": int((snap or {}).get("load", {}).get("requests_done_total", -1)),
        "client_reported": level["requests"],
        "client_stored_says": doc["run"]["samples"],
        "stored_measure": scorer.stored.get("measure", 0),
        "stored_warmup": scorer.stored.get("warmup", 0),
        "mock_received": stats["requests"],
        "mock_completed": stats["completed"],
        "matched": scorer.matched,
        "mock_without_sample": len(scorer.mock),
        "sample_without_mock": len(scorer.client),
        "duplicates": scorer.duplicates,
        "no_response_id": scorer.no_response_id,
    }
    lost = (
        counts["mock_without_sample"]
        + counts["sample_without_mock"]
        + counts["duplicates"]
        + abs(counts["client_done"] - counts["stored_measure"])
        + abs(counts["mock_completed"] - counts["stored_measure"] - counts["stored_warmup"])
    )
    assert scorer.level_t0 is not None
    return {
        "duration_s": duration_s,
        "wall_s": round(wall_s, 1),
        "window_s": window_s,
        "series": series,
        "level_start_s": round(scorer.level_t0 - t0, 2),
        "windows": [w.close() for w in scorer.windows],
        "samples": {**counts, "lost": lost},
        "worst_ttft": scorer.worst,
        "db_bytes": db_bytes,
        "level": {
            k: level.get(k)
            for k in ("requests", "ok", "errors", "duration_s", "ttft_ms", "itl_ms", "output_tok_s", "request_s")
        },
        "client_argv": ["moetune", *argv[3:]],
    }


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    """Start and end, steady slopes and verdicts of the series; the error's first and last window and slope."""
    t_start, t_end = r["level_start_s"], r["level_start_s"] + r["duration_s"]
    series = [s for s in r["series"] if t_start <= s["t_s"] <= t_end]  # the level; after it, draining and summary
    tail = [s for s in r["series"] if s["t_s"] > t_end]
    steady_from = t_start + max(STEADY_MIN_S, STEADY_AFTER * r["duration_s"])
    steady = [s for s in series if s["t_s"] >= steady_from] or series
    ts = [s["t_s"] for s in steady]
    out: dict[str, Any] = {
        "level_start_s": t_start,
        "steady_from_s": round(steady_from, 1),
        "thresholds": {
            "rss_mib_per_h": RSS_FLAT_MIB_PER_H,
            "fds_per_h": FDS_FLAT_PER_H,
            "threads_per_h": THREADS_FLAT_PER_H,
            "error_ms_per_h": ERROR_DRIFT_MS_PER_H,
        },
    }
    for key, limit in (("rss_mib", RSS_FLAT_MIB_PER_H), ("fds", FDS_FLAT_PER_H), ("threads", THREADS_FLAT_PER_H)):
        ys = [s[key] for s in steady]
        slope = _slope_per_h(ts, ys)
        out[key] = {
            "first": series[0][key] if series else None,
            "steady_start": ys[0] if ys else None,
            "end": ys[-1] if ys else None,
            "min": min(ys, default=None),
            "max": max(ys, default=None),
            "slope_per_h": None if slope is None else round(slope, 3),
            "tail_max": max((s[key] for s in tail), default=None),
            "verdict": "too short" if slope is None else "flat" if abs(slope) <= limit else "GROWS",
        }
    cpu = [s["cpu_pct"] for s in steady if s["cpu_pct"] is not None]
    mcpu = [s["mock_cpu_pct"] for s in steady if s["mock_cpu_pct"] is not None]
    out["cpu_pct_mean"] = round(float(np.mean(cpu)), 1) if cpu else None
    out["mock_cpu_pct_mean"] = round(float(np.mean(mcpu)), 1) if mcpu else None
    out["load1_mean"] = round(float(np.mean([s["load1"] for s in steady])), 2) if steady else None
    for w in r["windows"]:  # the machine's load while the window's requests ran
        loads = [s["load1"] for s in series if w["start_s"] <= s["t_s"] - t_start <= w["end_s"]]
        w["load1_mean"] = round(float(np.mean(loads)), 2) if loads else None
    wins = [w for w in r["windows"] if w["events"]]
    mid = [(w["start_s"] + w["end_s"]) / 2 for w in wins]
    for metric in ("ttft_err_ms", "itl_err_ms", "lag_ms", "mock_late_ms"):
        row: dict[str, Any] = {}
        for q in ("p50", "p99"):
            ys = [w[metric][q] for w in wins]
            slope = _slope_per_h(mid, ys)
            row[q] = {
                "first": ys[0] if ys else None,
                "last": ys[-1] if ys else None,
                "slope_ms_per_h": None if slope is None else round(slope, 4),
            }
        out[metric] = row
    drift = [out[m]["p50"]["slope_ms_per_h"] for m in ("ttft_err_ms", "itl_err_ms")]
    out["error_verdict"] = (
        "too short"
        if None in drift
        else "no drift"
        if all(abs(d) <= ERROR_DRIFT_MS_PER_H for d in drift if d is not None)
        else "DRIFTS"
    )
    out["tokens_per_s"] = r["level"]["output_tok_s"]  # as the client reports it
    per_request_s = float(np.mean([MOCK.token_times(i, OUTPUT_TOKENS)[-1] for i in range(len(MOCK.ttft_ms))]))
    out["nominal_tokens_per_s"] = round(OUTPUT_TOKENS / per_request_s * r["streams"], 1)  # the schedule's, no overhead
    done = r["samples"]["stored_measure"]
    slope = out["rss_mib"]["slope_per_h"]
    per_h = done / r["duration_s"] * 3600
    out["rss_bytes_per_request"] = None if slope is None or not per_h else round(slope * 2**20 / per_h, 1)
    return out


def main(results: Path, minutes: float | None = None, streams: int | None = None) -> None:
    minutes = minutes if minutes is not None else float(os.environ.get("SOAK_MINUTES") or DEFAULT_MINUTES)
    streams = streams if streams is not None else int(os.environ.get("SOAK_STREAMS") or DEFAULT_STREAMS)
    load0 = os.getloadavg()
    r = soak(minutes, streams)
    r["streams"] = streams
    summary = _summary(r)
    doc = {
        "what": "serve-bench soak: the client process's memory, descriptors, threads and timing error over a long "
        "run against the mock server, and every request accounted for",
        "command": f"make bench  (SOAK_MINUTES={minutes:g} python benchmarks/run.py soak)",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": load0,
            "loadavg_after": os.getloadavg(),
        },
        "config": {
            "streams": streams,
            "minutes": minutes,
            "sample_s": SAMPLE_S,
            "window_s": r["window_s"],
            "input_tokens": INPUT_TOKENS,
            "output_tokens": OUTPUT_TOKENS,
            "mock": {"ttft_ms": MOCK.ttft_ms, "itl_ms": MOCK.itl_ms},
            "client_argv": r["client_argv"],
        },
        "summary": summary,
        "samples": r["samples"],
        "level": r["level"],
        "history_bytes": r["db_bytes"],
        "wall_s": r["wall_s"],
        "windows": r["windows"],
        "worst_ttft": r["worst_ttft"],
        "series": r["series"],
    }
    (results / "soak.json").write_text(json.dumps(doc, indent=1) + "\n")
    (results / "soak.md").write_text(_markdown(doc))
    print(_markdown(doc))


def _f(x: Any, nd: int = 3) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def _contention(windows: list[dict[str, Any]]) -> str:
    """How the windows' count of TTFT errors over 1 ms goes with time and with the machine's load."""
    ws = [w for w in windows if w["load1_mean"] is not None]
    if len(ws) < 3:
        return ""
    n = [float(w["ttft_err_over_1ms"]) for w in ws]
    slope = _slope_per_h([(w["start_s"] + w["end_s"]) / 2 for w in ws], n)
    r = np.corrcoef(n, [w["load1_mean"] for w in ws])[0, 1] if np.std(n) > 0 else float("nan")
    return (
        f" Per window, their count's slope over the run is {_f(slope, 1)} requests/h, and its correlation with "
        f"the window's load average {r:.2f}."
    )


def _markdown(doc: dict[str, Any]) -> str:
    s, c, n = doc["summary"], doc["config"], doc["samples"]
    th = s["thresholds"]
    lines = [
        "# serve-bench soak: the client's memory, descriptors, samples and timing error over a long run",
        "",
        f"Measured by `{doc['command']}` on {doc['machine']['cpus']} CPUs shared with other work (load average "
        f"{s['load1_mean']} on average during the run), Python {doc['machine']['python']}: "
        f"`{' '.join(c['client_argv'][:2])} URL -C {c['streams']} --duration {c['minutes'] * 60:g} ...` in its own "
        f"process for {c['minutes']:g} minutes against the mock server (`tests.bench.mock_server`, another process: "
        f"TTFT {min(c['mock']['ttft_ms']):g}-{max(c['mock']['ttft_ms']):g} ms, ITL {min(c['mock']['itl_ms']):g}-"
        f"{max(c['mock']['itl_ms']):g} ms, {c['output_tokens']} tokens a request). The client was sampled every "
        f"{c['sample_s']:g} s (RSS, `/proc/PID/fd`, threads, CPU); {s['tokens_per_s']:.0f} tokens/s were timed "
        f"(the schedule's {s['nominal_tokens_per_s']:.0f} with no time between requests), the client used {s['cpu_pct_mean']}% of a core "
        f"and the mock {s['mock_cpu_pct_mean']}%. Slopes are least-squares fits over the steady part of the level "
        f"(from {s['steady_from_s']:g} s on, after the connections and prompts are made).",
        "",
        "| client process | first sample | steady start | end | slope per hour | verdict |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for key, name, unit, limit in (
        ("rss_mib", "RSS (MiB)", "MiB", th["rss_mib_per_h"]),
        ("fds", "open file descriptors", "", th["fds_per_h"]),
        ("threads", "threads", "", th["threads_per_h"]),
    ):
        v = s[key]
        nd = 1 if key == "rss_mib" else 0
        lines.append(
            f"| {name} | {_f(v['first'], nd)} | {_f(v['steady_start'], nd)} | {_f(v['end'], nd)} | "
            f"{_f(v['slope_per_h'], 2)} | {v['verdict']} (\\|slope\\| <= {limit:g}{' ' + unit if unit else ''}/h) |"
        )
    lines += [
        "",
        f"RSS slope per request: {_f(s['rss_bytes_per_request'], 1)} bytes. After the level (the last requests "
        f"draining, then the level's figures read back from the history, 8 bytes per token gap) the samples reached "
        f"{_f(s['rss_mib']['tail_max'], 1)} MiB before the process exited.",
        "",
        "| requests | count |",
        "|---|---:|",
        f"| answered by the mock (to the end) | {n['mock_completed']} |",
        f"| done by the client (its load meter) | {n['client_done']} measured + {n['stored_warmup']} warm-up |",
        f"| stored in the history (rows) | {n['stored_measure']} measured + {n['stored_warmup']} warm-up |",
        f"| paired by response id | {n['matched']} |",
        f"| answered without a stored sample / stored without an answer / stored twice | "
        f"{n['mock_without_sample']} / {n['sample_without_mock']} / {n['duplicates']} |",
        f"| **lost** | **{n['lost']}** |",
        "",
        f"Timing error against the mock's schedule ({len(doc['windows'])} windows of {c['window_s']:g} s, by send "
        f"time; verdict on the median's slope, \\|slope\\| <= {th['error_ms_per_h']:g} ms/h): **{s['error_verdict']}**.",
        "",
        "| error (ms) | first window p50 | last window p50 | p50 slope (ms/h) | first p99 | last p99 | p99 slope (ms/h) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for metric, name in (
        ("ttft_err_ms", "TTFT error"),
        ("itl_err_ms", "ITL error"),
        ("lag_ms", "lag (arrival - write)"),
        ("mock_late_ms", "mock late (its own jitter)"),
    ):
        v = s[metric]
        lines.append(
            f"| {name} | {_f(v['p50']['first'])} | {_f(v['p50']['last'])} | {_f(v['p50']['slope_ms_per_h'])} | "
            f"{_f(v['p99']['first'])} | {_f(v['p99']['last'])} | {_f(v['p99']['slope_ms_per_h'])} |"
        )
    lines += [
        "",
        "| window (s) | requests | errors | tokens | TTFT err p50 / p99 / max | TTFT err > 1 ms | "
        "ITL err p50 / p99 / max | mock late p99 | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for w in doc["windows"]:
        t, i = w["ttft_err_ms"], w["itl_err_ms"]
        lines.append(
            f"| {w['start_s']:g}-{w['end_s']:g} | {w['requests']} | {w['errors']} | {w['events']} | "
            f"{_f(t['p50'])} / {_f(t['p99'])} / {_f(t['max'], 1)} | {w['ttft_err_over_1ms']} | "
            f"{_f(i['p50'])} / {_f(i['p99'])} / {_f(i['max'], 1)} | {_f(w['mock_late_ms']['p99'], 1)} | "
            f"{_f(w['load1_mean'], 2)} |"
        )
    over = sum(w["ttft_err_over_1ms"] for w in doc["windows"])
    total = sum(w["requests"] - w["errors"] for w in doc["windows"])
    worst = doc["worst_ttft"][0] if doc["worst_ttft"] else None
    lines += ["", f"TTFT error over 1 ms: {over} of {total} requests ({100 * over / max(total, 1):.2f}%)."]
    if worst is not None and worst["ttft_err_ms"] > 1.0:
        ev = worst["client_events"][0]
        lines += [
            f"The worst ({worst['ttft_err_ms']:.1f} ms, `worst_ttft` in soak.json): the mock wrote the first token at "
            f"{worst['mock_writes'][0]:.4f} s, the client read it with the next ones at {ev['t']:.4f} s (the kernel's "
            f"time of the last) and recorded that it could not have arrived before {_f(ev['earliest'], 4)} s, where "
            "it clipped the first token. That bound is when the event loop's `select()` returned by its own stamp; "
            "when the client thread is kept off the CPU between the kernel's readiness check and that stamp (the "
            "machine's load average above its 2 cores), the bound is later than the bytes' arrival, and the first "
            "token is reported late by up to the time the client did not run: the client's error under CPU "
            "contention." + _contention(doc["windows"])
        ]
    lines += [
        "",
        f"History written: {doc['history_bytes'] / 2**20:.0f} MiB. The series (every sample) and the "
        "windows are in soak.json.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, help=f"length (default: SOAK_MINUTES or {DEFAULT_MINUTES:g})")
    ap.add_argument("--streams", type=int, help=f"concurrent streams (default: SOAK_STREAMS or {DEFAULT_STREAMS})")
    ap.add_argument("--results", type=Path, default=HERE / "results")
    ap.add_argument("--render", action="store_true", help="only write soak.md again from soak.json")
    a = ap.parse_args()
    if a.render:
        (a.results / "soak.md").write_text(_markdown(json.loads((a.results / "soak.json").read_text())))
    else:
        main(a.results, a.minutes, a.streams)
