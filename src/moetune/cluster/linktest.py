"""`moetune link-test A B`: bandwidth and latency from node A to node B's link address.

Each end runs on its node: over ssh where the hardware file gives the node an ``ssh`` target,
here otherwise. Bandwidth comes from iperf3 where both ends have it (else from the built-in
``linkprobe`` script), once with a single stream (what one llama.cpp RPC connection gets) and once
with several in parallel (what the link can carry); latency always from the built-in script's
small-message round trips. Results are raw numbers (bytes, seconds, round-trip times);
:func:`summary` derives the figures.
"""

from __future__ import annotations

import json
import math
import os
import select
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moetune import __version__
from moetune.errors import InputError, RuntimeFailure
from moetune.hardware.inventory import Inventory, Node
from moetune.kinds import RunKind, RunStatus
from moetune.run.remote import RemoteError, run_remote, ssh_argv, ssh_base
from moetune.store.db import ResultsDB
from moetune.store.record import HostRef, RunMeta

IPERF3, BUILTIN, AUTO = "iperf3", "builtin", "auto"
TOOLS = (AUTO, IPERF3, BUILTIN)
DEFAULT_PORT = 5201
LISTEN_TIMEOUT_S = 20.0
PROBE = Path(__file__).with_name("linkprobe.py")


@dataclass(frozen=True, slots=True, kw_only=True)
class Throughput:
    streams: int
    bytes: int  # received
    seconds: float
    tool: str
    raw: dict[str, object] = field(default_factory=dict, compare=False)  # the tool's own numbers

    @property
    def bits_per_s(self) -> float:
        return self.bytes * 8 / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkResult:
    src: str
    dst: str
    addr: str  # the address on dst that src sent to
    port: int
    tool: str  # what measured the bandwidth
    duration_s: float
    rtt_s: tuple[float, ...]  # one per round trip
    msg_bytes: int
    throughput: tuple[Throughput, ...]


@dataclass(frozen=True, slots=True)
class End:
    """One end of the test: a node, reached over ssh or run here."""

    node: Node
    ssh: tuple[str, ...] | None  # the ssh client and options, when the node is remote

    @property
    def where(self) -> str:
        return f"{self.node.name} (ssh {self.node.ssh})" if self.node.ssh else f"{self.node.name} (here)"

    def argv(self, cmd: Sequence[str]) -> list[str]:
        if self.node.ssh is None or self.ssh is None:
            return list(cmd)
        return ssh_argv(self.ssh, self.node.ssh, "exec " + shlex.join(cmd))

    def python(self) -> str:
        return "python3" if self.node.ssh else sys.executable

    def has(self, program: str) -> bool:
        if self.node.ssh is None or self.ssh is None:
            return shutil.which(program) is not None
        return bool(run_remote(self.ssh, self.node.ssh, f"command -v {shlex.quote(program)} || true").strip())


# -- figures (pure) --------------------------------------------------------------------------


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summary(r: LinkResult) -> dict[str, Any]:
    single = next((t for t in r.throughput if t.streams == 1), None)
    parallel = max((t for t in r.throughput if t.streams > 1), key=lambda t: t.streams, default=None)
    return {
        "from": r.src,
        "to": r.dst,
        "addr": r.addr,
        "tool": r.tool,
        "single_bits_per_s": single.bits_per_s if single else None,
        "parallel_streams": parallel.streams if parallel else None,
        "parallel_bits_per_s": parallel.bits_per_s if parallel else None,
        "rtt_median_s": statistics.median(r.rtt_s) if r.rtt_s else None,
        "rtt_p99_s": percentile(r.rtt_s, 0.99) if r.rtt_s else None,
        "rtt_min_s": min(r.rtt_s) if r.rtt_s else None,
        "round_trips": len(r.rtt_s),
    }


def _object(doc: Mapping[str, object], key: str, what: str) -> Mapping[str, object]:
    v = doc.get(key)
    if not isinstance(v, Mapping):
        raise RuntimeFailure(f"{what}: no {key!r} object in its output")
    return v


def _number(doc: Mapping[str, object], key: str, what: str) -> float:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise RuntimeFailure(f"{what}: no number {key!r} in its output")
    return v


def _list(doc: Mapping[str, object], key: str, what: str) -> list[object]:
    v = doc.get(key)
    if not isinstance(v, list):
        raise RuntimeFailure(f"{what}: no list {key!r} in its output")
    return v


def _mapping(x: object) -> Mapping[str, object]:
    if not isinstance(x, Mapping):
        raise RuntimeFailure(f"{BUILTIN}: a throughput test that is not an object")
    return x


def _float(x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float):
        raise RuntimeFailure(f"{BUILTIN}: a round trip that is not a number")
    return float(x)


def iperf3_throughput(doc: Mapping[str, object], streams: int) -> Throughput:
    """iperf3 -J client output: what the receiver got."""
    if doc.get("error"):
        raise RuntimeFailure(f"iperf3: {doc['error']}")
    end = _object(doc, "end", "iperf3")
    rec = _object(end, "sum_received", "iperf3")
    return Throughput(
        streams=streams,
        bytes=int(_number(rec, "bytes", "iperf3")),
        seconds=float(_number(rec, "seconds", "iperf3")),
        tool=IPERF3,
        raw={"sum_sent": end.get("sum_sent"), "sum_received": rec},
    )


# -- running the ends ------------------------------------------------------------------------


def ends(hw: Inventory, a: str, b: str) -> tuple[End, End, str]:
    """The two ends and the address on B that A sends to."""
    nodes = {n.name: n for n in hw.nodes}
    for name in (a, b):
        if name not in nodes:
            raise InputError(f"no node {name!r} in {hw.source or 'the hardware file'} (nodes: {', '.join(nodes)})")
    if a == b:
        raise InputError("link-test needs two different nodes")
    dst = nodes[b]
    if dst.link_addr is None:
        raise InputError(
            f"node {b} has no link_addr: link-test sends to the address the nodes reach each other on",
            hint=f"add `link_addr: <its address on the link>` to node {b} in the hardware file",
        )
    base = tuple(ssh_base())
    return End(nodes[a], base), End(dst, base), dst.link_addr


def _start_server(end: End, cmd: Sequence[str], stdin: str | None, ready: str) -> subprocess.Popen[bytes]:
    """Start one server end and wait until its output contains ``ready``."""
    p = subprocess.Popen(
        end.argv(cmd),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    if stdin is not None:
        assert p.stdin is not None
        p.stdin.write(stdin.encode())
        p.stdin.close()
    assert p.stdout is not None and p.stderr is not None
    deadline = time.monotonic() + LISTEN_TIMEOUT_S
    seen = b""
    while time.monotonic() < deadline:
        r, _, _ = select.select([p.stdout], [], [], 0.2)
        if r:
            chunk = os.read(p.stdout.fileno(), 65536)
            seen += chunk
            if ready.encode() in seen:
                return p
            if not chunk:
                break
        elif p.poll() is not None:
            break
    _finish(p, 0)
    err = p.stderr.read().decode(errors="replace").strip()
    raise RuntimeFailure(
        f"link-test: the server end on {end.where} did not start: "
        f"{(err or seen.decode(errors='replace')).strip()[-300:]}",
        hint="check that the port is free there and that the address belongs to that node",
    )


def _finish(p: subprocess.Popen[bytes], timeout_s: float) -> None:
    try:
        p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        p.kill()  # the remote end stops on its own (linkprobe's idle limit, iperf3 -1)
        p.wait()


def _client(end: End, cmd: Sequence[str], stdin: str | None, timeout_s: float) -> str:
    try:
        r = subprocess.run(
            end.argv(cmd),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=None if stdin is not None else subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(
            f"link-test: the measuring end on {end.where} gave no result after {timeout_s:.0f} s"
        ) from None
    if not r.stdout.strip():
        raise RuntimeFailure(f"link-test: the measuring end on {end.where} failed: {r.stderr.strip()[-300:]}")
    return r.stdout


def builtin_run(
    a: End, b: End, addr: str, port: int, *, streams: Sequence[int], duration_s: float, pings: int
) -> dict[str, object]:
    """The built-in script on both ends: round trips, then each stream count in turn."""
    script = PROBE.read_text()
    idle = max(30.0, 3 * duration_s)
    srv = _start_server(
        b, [b.python(), "-", "serve", "--bind", addr, "--port", str(port), "--idle", str(idle)], script, "listening"
    )
    try:
        out = _client(
            a,
            [
                a.python(),
                "-",
                "measure",
                "--host",
                addr,
                "--port",
                str(port),
                "--duration",
                str(duration_s),
                "--streams",
                ",".join(map(str, streams)),
                "--pings",
                str(pings),
            ],
            script,
            timeout_s=60 + duration_s * (len(streams) + 1) * 2,
        )
    finally:
        _finish(srv, 10)
    doc: object = json.loads(out.strip().splitlines()[-1])
    if not isinstance(doc, dict):
        raise RuntimeFailure(f"link-test from {a.where} to {addr}:{port}: the probe wrote no JSON object")
    if "error" in doc:
        raise RuntimeFailure(
            f"link-test from {a.where} to {addr}:{port}: {doc['error']}",
            hint="check the address, the port and any firewall between the nodes",
        )
    return doc


def iperf3_run(a: End, b: End, addr: str, port: int, *, streams: int, duration_s: float) -> Throughput:
    srv = _start_server(
        b, ["iperf3", "-s", "-1", "-B", addr, "-p", str(port), "--forceflush"], None, "Server listening"
    )
    try:
        seconds = max(1, math.ceil(duration_s))  # iperf3 takes whole seconds (and 0 means forever)
        out = _client(
            a,
            ["iperf3", "-c", addr, "-p", str(port), "-t", str(seconds), "-P", str(streams), "-J"],
            None,
            timeout_s=60 + seconds * 2,
        )
    finally:
        _finish(srv, 10)
    return iperf3_throughput(json.loads(out), streams)


def link_test(
    hw: Inventory,
    a: str,
    b: str,
    *,
    streams: int = 8,
    duration_s: float = 3.0,
    pings: int = 200,
    port: int = DEFAULT_PORT,
    tool: str = AUTO,
) -> LinkResult:
    if tool not in TOOLS:
        raise InputError(f"--tool {tool!r}: choose {', '.join(TOOLS)}")
    src, dst, addr = ends(hw, a, b)
    try:
        if tool == AUTO:
            tool = IPERF3 if src.has("iperf3") and dst.has("iperf3") else BUILTIN
        elif tool == IPERF3:
            missing = [e.where for e in (src, dst) if not e.has("iperf3")]
            if missing:
                raise InputError(
                    f"--tool iperf3: no iperf3 on {', '.join(missing)}",
                    hint="install it there (Debian: apt install iperf3), or use --tool builtin",
                )
        counts = [1, streams]
        doc = builtin_run(
            src, dst, addr, port, streams=counts if tool == BUILTIN else [], duration_s=duration_s, pings=pings
        )
        if tool == BUILTIN:
            tps = tuple(
                Throughput(
                    streams=int(_number(t, "streams", BUILTIN)),
                    bytes=int(_number(t, "bytes", BUILTIN)),
                    seconds=float(_number(t, "seconds", BUILTIN)),
                    tool=BUILTIN,
                    raw={"per_stream_bytes": t.get("per_stream_bytes")},
                )
                for t in (_mapping(x) for x in _list(doc, "throughput", BUILTIN))
            )
        else:
            tps = tuple(iperf3_run(src, dst, addr, port, streams=n, duration_s=duration_s) for n in counts)
    except RemoteError as e:
        raise RuntimeFailure(f"link-test: {e}", hint=e.hint) from None
    return LinkResult(
        src=a,
        dst=b,
        addr=addr,
        port=port,
        tool=tool,
        duration_s=duration_s,
        rtt_s=tuple(_float(x) for x in _list(doc, "rtt_s", BUILTIN)),
        msg_bytes=int(_number(doc, "msg_bytes", BUILTIN)),
        throughput=tps,
    )


def samples(r: LinkResult) -> list[dict[str, object]]:
    """Raw samples for the results database: the round trips, then one per throughput test."""
    out: list[dict[str, object]] = [
        {"test": "latency", "tool": BUILTIN, "msg_bytes": r.msg_bytes, "rtt_s": list(r.rtt_s)}
    ]
    for t in r.throughput:
        out.append(
            {
                "test": "throughput",
                "tool": t.tool,
                "streams": t.streams,
                "bytes": t.bytes,
                "seconds": t.seconds,
                "raw": t.raw,
            }
        )
    return out


def record(db: ResultsDB, r: LinkResult, *, hardware_file: str | None, label: str | None = None) -> int:
    """Keep a link test in the results history: its raw samples and its summary; the run's id."""
    meta = RunMeta(
        kind=RunKind.LINK_TEST,
        moetune_version=__version__,
        argv=tuple(sys.argv),
        started_unix=time.time(),
        host=HostRef.here(hardware_file),
        details={
            "from": r.src,
            "to": r.dst,
            "addr": r.addr,
            "port": r.port,
            "tool": r.tool,
            "duration_s": r.duration_s,
        },
    )
    run_id = db.create_run(meta, label=label or f"{r.src}->{r.dst}", target=f"{r.src}->{r.dst} ({r.addr})")
    for s in samples(r):
        db.add_sample(run_id, s)
    db.finish_run(run_id, RunStatus.DONE, summary(r))
    return run_id
