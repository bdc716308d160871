"""`moetune link-test`: figures from raw numbers, and both tools on loopback (both ends here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from moetune.cluster.linktest import LinkResult, Throughput, iperf3_throughput, percentile, summary
from moetune.errors import RuntimeFailure
from moetune.store.db import ResultsDB
from tests.helpers import free_port, run_cli

CPU = {"cores": 2, "ram_mib": 4000, "ram_bw_gbs": 20}


def test_summary_from_raw_numbers() -> None:
    r = LinkResult(
        src="a",
        dst="b",
        addr="10.0.0.2",
        port=5201,
        tool="builtin",
        duration_s=3.0,
        rtt_s=tuple(x * 1e-6 for x in range(1, 101)),
        msg_bytes=1,
        throughput=(
            Throughput(streams=1, bytes=3_750_000_000, seconds=3.0, tool="builtin"),
            Throughput(streams=8, bytes=15_000_000_000, seconds=3.0, tool="builtin"),
        ),
    )
    s = summary(r)
    assert s["single_bits_per_s"] == pytest.approx(10e9) and s["parallel_bits_per_s"] == pytest.approx(40e9)
    assert s["parallel_streams"] == 8 and s["round_trips"] == 100
    assert s["rtt_median_s"] == pytest.approx(50.5e-6) and s["rtt_min_s"] == pytest.approx(1e-6)
    assert s["rtt_p99_s"] == pytest.approx(99.01e-6)
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0


def test_iperf3_json() -> None:
    doc = {
        "end": {
            "sum_sent": {"bytes": 13_300_000_000, "seconds": 1.0, "bits_per_second": 106.4e9},
            "sum_received": {"bytes": 13_200_000_000, "seconds": 1.0, "bits_per_second": 105.6e9},
        }
    }
    t = iperf3_throughput(doc, 8)
    assert (t.streams, t.bytes, t.seconds, t.tool) == (8, 13_200_000_000, 1.0, "iperf3")
    assert t.bits_per_s == pytest.approx(105.6e9)
    with pytest.raises(RuntimeFailure, match="iperf3: unable to connect"):
        iperf3_throughput({"error": "unable to connect to server: Connection refused"}, 1)


def loopback_hw(tmp_path: Path) -> Path:
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": "a", "link_addr": "127.0.0.1", "cpu": CPU},
                    {"name": "b", "link_addr": "127.0.0.1", "cpu": CPU},
                ]
            }
        )
    )
    return hw


@pytest.mark.parametrize("tool", ["builtin", "iperf3"])
def test_loopback(tmp_path: Path, tool: str) -> None:
    if tool == "iperf3" and shutil.which("iperf3") is None:
        pytest.skip("iperf3 is not installed")
    hw = loopback_hw(tmp_path)
    r = run_cli(
        "link-test",
        "a",
        "b",
        "--hw",
        str(hw),
        "--duration",
        "0.3",
        "--streams",
        "2",
        "--pings",
        "50",
        "--port",
        str(free_port()),
        "--tool",
        tool,
        "--label",
        "lo",
        "--json",
    )
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["tool"] == tool and doc["from"] == "a" and doc["to"] == "b"
    assert doc["single_bits_per_s"] > 1e6 and doc["parallel_bits_per_s"] > 1e6 and doc["parallel_streams"] == 2
    assert 0 < doc["rtt_median_s"] < 0.1 and doc["round_trips"] == 50
    with ResultsDB.open(Path(doc["run"]["db"])) as db:
        run = db.run(doc["run"]["id"])
        assert (run.kind, run.label, run.status, run.meta.details["tool"]) == ("link-test", "lo", "done", tool)
        lat, one, two = db.samples(run.id)
        assert len(lat["rtt_s"]) == 50 and (one["streams"], two["streams"]) == (1, 2)
        assert one["bytes"] > 0 and one["seconds"] > 0
        machine = db.metrics(run.id)  # this host while the link was measured: a first and a last sample at least
        assert len(machine) >= 2 and {m["phase"] for m in machine} == {"link-test"}
    table = run_cli(
        "link-test",
        "a",
        "b",
        "--hw",
        str(hw),
        "--duration",
        "0.2",
        "--pings",
        "10",
        "--port",
        str(free_port()),
        "--tool",
        tool,
    )
    assert table.exit_code == 0, table.stderr
    assert "bandwidth, 1 stream" in table.stdout and "Gbit/s" in table.stdout and "stored as run 2" in table.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("a", "c"), "no node 'c' in"),
        (("a", "a"), "two different nodes"),
        (("b", "a"), "node a has no link_addr"),
    ],
)
def test_bad_input(tmp_path: Path, args: tuple[str, str], message: str) -> None:
    hw = tmp_path / "hw.yaml"
    hw.write_text(
        yaml.safe_dump({"nodes": [{"name": "a", "cpu": CPU}, {"name": "b", "link_addr": "127.0.0.1", "cpu": CPU}]})
    )
    r = run_cli("link-test", *args, "--hw", str(hw))
    assert r.exit_code == 2 and message in r.stderr


def test_iperf3_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no iperf3 anywhere
    r = run_cli("link-test", "a", "b", "--hw", str(loopback_hw(tmp_path)), "--tool", "iperf3")
    assert r.exit_code == 2 and "--tool iperf3: no iperf3 on a (here), b (here)" in r.stderr


def test_port_taken(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run_cli(
            "link-test",
            "a",
            "b",
            "--hw",
            str(loopback_hw(tmp_path)),
            "--tool",
            "builtin",
            "--port",
            str(s.getsockname()[1]),
        )
    assert r.exit_code == 1
    assert "the server end on b (here) did not start" in r.stderr and "Address already in use" in r.stderr


def test_iperf3_json_without_its_figures_is_a_runtime_failure() -> None:
    with pytest.raises(RuntimeFailure, match="iperf3: no 'end'"):
        iperf3_throughput({"start": {}}, 1)
    with pytest.raises(RuntimeFailure, match="iperf3: no number 'bytes'"):
        iperf3_throughput({"end": {"sum_received": {"bytes": "many", "seconds": 1.0}}}, 1)
