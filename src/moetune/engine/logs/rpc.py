"""The grammar of an RPC worker's log (``ggml-rpc-server``, formerly ``rpc-server``), both eras.

The worker prints a banner on stdout (``Starting RPC server v7.0.0``, ``endpoint``, its devices,
``transport : TCP`` or ``TCP (RDMA auto-negotiate enabled)``), then a line per client connection.
Builds with RDMA say ``RDMA probed: dev=...`` and ``RDMA activated: qpn=...`` (with
``GGML_RPC_DEBUG=1`` for the probe) when a connection switched transport. A mainline worker says
why it refused a client of another protocol (``HELLO request size mismatch (0 vs 24) — client
needs upgrade to protocol v7.x``, the client then aborts); ik_llama.cpp's says nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from moetune.engine.logs.common import ERROR_WORDS
from moetune.engine.logs.types import ABORTED, BIND_FAILED, RPC_PROTOCOL, Device, Evidence, Failure, WorkerLog

VERSION = re.compile(r"Starting RPC server v(\S+)")
ENDPOINT = re.compile(r"^\s*endpoint\s*: (\S+)")
TRANSPORT = re.compile(r"^\s*transport\s*: (.+?)\s*$")
DEVICE = re.compile(r"^\s+(\w+): (.+?) \((\d+) MiB, (\d+) MiB free\)\s*$")
DEVICE_IK = re.compile(r"^\s+(\w+):\s+(\d+) MiB total,\s+(\d+) MiB free")
RDMA_PROBED = re.compile(r"RDMA(?:\([^)]*\))? probed: ")
RDMA_ACTIVATED = re.compile(r"RDMA(?:\([^)]*\))? activated: ")
RDMA_ERROR = re.compile(r"RDMA.*(?:failed|error)", re.I)
ACCEPTED = re.compile(r"Accepted client connection")
BIND = re.compile(r"Failed to create server socket")
ABORT = re.compile(r"^\S+\.(?:c|cc|cpp|cu|h):\d+: (.+)$")
REFUSED = re.compile(r"(HELLO request size mismatch.*|Expected HELLO command.*)$")


def parse_worker_log(text: str) -> WorkerLog:
    lines = tuple(text.splitlines())
    version = endpoint = transport = None
    devices: list[Device] = []
    probed: list[Evidence] = []
    activated: list[Evidence] = []
    rdma_errors: list[Evidence] = []
    errors: list[Evidence] = []
    failures: list[Failure] = []
    connections = 0
    for n, line in enumerate(lines, 1):
        if m := VERSION.search(line):
            version = m[1]
        elif m := ENDPOINT.search(line):
            endpoint = m[1]
        elif m := TRANSPORT.search(line):
            transport = m[1]
        elif m := DEVICE.search(line):
            devices.append(Device(name=m[1], description=m[2], total_mib=float(m[3]), free_mib=float(m[4]), line=n))
        elif m := DEVICE_IK.search(line):
            devices.append(Device(name=m[1], description="", total_mib=float(m[2]), free_mib=float(m[3]), line=n))
        elif ACCEPTED.search(line):
            connections += 1
        if RDMA_PROBED.search(line):
            probed.append(Evidence(n, line))
        if RDMA_ACTIVATED.search(line):
            activated.append(Evidence(n, line))
        if RDMA_ERROR.search(line):
            rdma_errors.append(Evidence(n, line))
        if BIND.search(line):
            failures.append(Failure(BIND_FAILED, endpoint, n))
        if m := ABORT.search(line):
            failures.append(Failure(ABORTED, m[1].strip(), n))
        if m := REFUSED.search(line):
            failures.append(Failure(RPC_PROTOCOL, m[1].strip(), n))
        if ERROR_WORDS.search(line):
            errors.append(Evidence(n, line))
    # the bind failure is printed (stderr) before the banner (stdout, flushed at exit): name the endpoint
    failures = [Failure(f.kind, f.subject or endpoint, f.line) for f in failures]
    return WorkerLog(
        lines=lines,
        version=version,
        endpoint=endpoint,
        devices=tuple(devices),
        transport=transport,
        rdma_probed=tuple(probed),
        rdma_activated=tuple(activated),
        rdma_errors=tuple(rdma_errors),
        connections=connections,
        errors=tuple(errors),
        failures=tuple(failures),
    )


def is_worker_log(lines: Sequence[str]) -> bool:
    head = lines[:200]
    return any(VERSION.search(x) or ACCEPTED.search(x) or RDMA_PROBED.search(x) for x in head)
