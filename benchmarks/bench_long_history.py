"""Reading back a long serve-bench run: `moetune serve-report`, `report`, `results` of a run of
60,000 requests (the soak's 30 minutes at 256 streams stored 59,166), each in its own process,
their peak RSS and wall time.

The run is made by the product: `moetune serve-bench` against the mock server (128 streams, 128
output tokens a request, for 20 s), its stored requests then copied in the history until the run
holds ``REQUESTS`` (the same samples again, at later sequence numbers, so every reader sees a run
of that size). Writes results/long_history.json and results/long_history.md.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.bench.mock_server import MockConfig, mock_server  # noqa: E402

REQUESTS = 60_000
STREAMS = 128
SECONDS = 20
MOCK = MockConfig(ttft_ms=(20.0, 40.0), itl_ms=(2.0, 4.0))


def _child(argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run one command in a fresh process: its exit, wall time, and peak RSS (MiB) measured by the
    kernel (wait4's rusage of that child alone)."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t0
    err = p.stderr.read().decode() if p.stderr else ""
    if p.stderr:
        p.stderr.close()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise RuntimeError(f"{' '.join(argv[2:4])} exited {rc}: {err[-1500:]}")
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}


def _grow(db: Path, run_id: int, target: int) -> int:
    """Copy the run's measured samples after themselves until it holds ``target``."""
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT phase, data FROM samples WHERE run_id = ? AND phase = 'measure' ORDER BY seq", (run_id,)
    ).fetchall()
    (seq,) = con.execute(
        "SELECT COALESCE(MAX(seq), -1) + 1 FROM samples WHERE run_id = ? AND phase = 'measure'", (run_id,)
    ).fetchone()
    n = len(rows)
    with con:
        while n < target:
            batch = rows[: target - n]
            con.executemany(
                "INSERT INTO samples (run_id, phase, seq, created_at, data) VALUES (?, ?, ?, datetime('now'), ?)",
                [(run_id, ph, seq + i, data) for i, (ph, data) in enumerate(batch)],
            )
            seq += len(batch)
            n += len(batch)
    (count,) = con.execute("SELECT COUNT(*) FROM samples WHERE run_id = ? AND phase = 'measure'", (run_id,)).fetchone()
    con.close()
    return int(count)


def main(results: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="moetune-long-") as tmp, mock_server(MOCK) as url:
        db = Path(tmp) / "long.sqlite"
        env = {
            **os.environ,
            "MOETUNE_DATA_DIR": str(Path(tmp) / "data"),
            "MOETUNE_CACHE_DIR": str(Path(tmp) / "cache"),
            "MOETUNE_METRICS_INTERVAL": "0",
        }
        py = [sys.executable, "-m", "moetune"]
        made = subprocess.run(
            [
                *py,
                "serve-bench",
                url,
                "--concurrency",
                str(STREAMS),
                "--duration",
                str(SECONDS),
                "--input-len",
                "64",
                "--output-len",
                "128",
                "--label",
                "long",
                "--db",
                str(db),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if made.returncode != 0:
            raise RuntimeError(f"serve-bench exited {made.returncode}: {made.stderr[-1500:]}")
        run_id = int(json.loads(made.stdout)["run"]["id"])
        measured = _grow(db, run_id, 0)
        requests = _grow(db, run_id, REQUESTS)
        size_mib = db.stat().st_size / (1 << 20)
        readers = {
            "serve-report --json": _child([*py, "serve-report", str(run_id), "--json", "--db", str(db)], env),
            "report -o page.html": _child(
                [*py, "report", str(run_id), "-o", str(Path(tmp) / "page.html"), "--db", str(db)], env
            ),
            "results show": _child([*py, "results", "show", str(run_id), "--db", str(db)], env),
            "results list": _child([*py, "results", "list", "--db", str(db)], env),
            "results export --format csv": _child(
                [
                    *py,
                    "results",
                    "export",
                    str(run_id),
                    "--format",
                    "csv",
                    "-o",
                    str(Path(tmp) / "x.csv"),
                    "--db",
                    str(db),
                ],
                env,
            ),
            "results export --format json": _child(
                [
                    *py,
                    "results",
                    "export",
                    str(run_id),
                    "--format",
                    "json",
                    "-o",
                    str(Path(tmp) / "x.json"),
                    "--db",
                    str(db),
                ],
                env,
            ),
            "--version (the interpreter alone)": _child([*py, "--version"], env),
        }
    doc = {
        "requests": requests,
        "requests_measured": measured,
        "history_mib": round(size_mib, 1),
        "streams": STREAMS,
        "seconds": SECONDS,
        "readers": readers,
        "self_peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    (results / "long_history.json").write_text(json.dumps(doc, indent=2))
    lines = [
        "# reading back a long serve-bench run",
        "",
        f"`python benchmarks/run.py long_history`: a serve-bench run against the mock ({STREAMS} streams, "
        f"{SECONDS} s, {measured:,} requests measured), its samples copied until the run holds {requests:,} "
        f"requests ({size_mib:,.0f} MiB of history); each reader in its own process.",
        "",
        "| command | wall s | peak RSS MiB |",
        "|---|---:|---:|",
    ]
    lines += [f"| `moetune {k}` | {v['wall_s']} | {v['peak_rss_mib']} |" for k, v in readers.items()]
    (results / "long_history.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(HERE / "results")
