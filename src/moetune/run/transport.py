"""The RPC transport, chosen explicitly and confirmed from the worker's log.

llama.cpp builds with RDMA support (``GGML_RPC_RDMA``, on by default where libibverbs is found)
switch a connection to RDMA by themselves whenever a RoCE device matches the address, so "TCP
unless asked" does not hold (reference report 004): an A/B of TCP against RDMA can compare RDMA
with RDMA. moetune therefore always chooses:

- ``tcp``: on builds with RDMA, ``GGML_RPC_NO_RDMA=1`` (and ``GGML_RDMA_DEV=disabled`` for builds
  older than that variable) on the worker and on the server; no RDMA activation may appear.
- ``rdma``: refused before anything starts unless the worker's and the server's builds have RDMA;
  then the worker's log must show ``RDMA activated``.
- ``auto``: the build decides; what it chose is recorded all the same.

Every process of a run also carries ``MOETUNE_TRANSPORT`` (what was asked), which ``doctor`` reads.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable
from pathlib import Path

from moetune.engine.logs.types import WorkerLog
from moetune.kinds import Transport
from moetune.run.diagnose import Diagnosis

TRANSPORT_ENV = "MOETUNE_TRANSPORT"
TCP_ENV = {"GGML_RPC_NO_RDMA": "1", "GGML_RDMA_DEV": "disabled"}
RDMA_MARK = b"RDMA activated"  # a string only builds with the RDMA transport contain
TRANSPORT_MISMATCH = "transport_mismatch"


def rdma_capable(files: Iterable[Path]) -> bool:
    """Whether any of these binaries or libraries was built with the RDMA transport."""
    for f in files:
        try:
            with open(f, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
                if m.find(RDMA_MARK) >= 0:
                    return True
        except (OSError, ValueError):  # missing, unreadable or empty
            continue
    return False


def engine_files(binary: Path) -> list[Path]:
    """The binary and the ggml RPC libraries a shared build keeps beside it or in ../lib."""
    d = binary.parent
    return [binary, *sorted(d.glob("lib*ggml-rpc*")), *sorted((d.parent / "lib").glob("lib*ggml-rpc*"))]


def env_for(requested: str, capable: bool, rdma_dev: str | None = None) -> dict[str, str]:
    """Variables a worker or a server using RPC gets for the requested transport."""
    env = {TRANSPORT_ENV: requested}
    if requested == Transport.TCP and capable:
        env.update(TCP_ENV)
    if requested == Transport.RDMA and rdma_dev:
        env["GGML_RDMA_DEV"] = rdma_dev
    return env


def observed(log: WorkerLog) -> str | None:
    """The transport a worker's log shows: RDMA once a connection activated it, TCP once a client
    connected (or the banner said so) without it; None before anything tells."""
    if log.rdma_activated:
        return "RDMA"
    if log.connections or log.transport:
        return "TCP"
    return None


def mismatch(name: str, requested: str, seen: str | None, log: WorkerLog) -> Diagnosis | None:
    """A diagnosis when the log contradicts what was asked (``auto`` accepts anything)."""
    if (
        requested == Transport.AUTO
        or (requested == Transport.TCP and seen != "RDMA")
        or (requested == Transport.RDMA and seen == "RDMA")
    ):
        return None
    ev = tuple(log.evidence(e.line) for e in (*log.rdma_activated, *log.rdma_errors)[:4])
    if requested == Transport.RDMA:
        why = "no connection activated RDMA" if seen else "no client connection shows in its log"
        return Diagnosis(
            cause=TRANSPORT_MISMATCH,
            process=name,
            message=f"{name}: asked for RDMA but the worker's log shows {seen or 'nothing'} ({why})",
            hint="check the RoCE device and its address (GGML_RDMA_DEV, --rdma-dev), or launch with --transport tcp",
            evidence=ev,
        )
    return Diagnosis(
        cause=TRANSPORT_MISMATCH,
        process=name,
        message=f"{name}: asked for TCP but the worker's log shows {seen or 'nothing'}",
        hint="this build ignores GGML_RPC_NO_RDMA: rebuild with -DGGML_RPC_RDMA=OFF for a TCP baseline",
        evidence=ev,
    )
