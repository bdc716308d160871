"""The RPC transport in a tune's search space (``--transport``, ``--try-transport``).

The transport is a launch option, not the plan's: a candidate is the same plan launched over TCP
or over RDMA. A search may vary it only where the hardware file says the link to every RPC node
carries RDMA beside TCP (``rdma: true`` on the node), and an RDMA candidate is refused before the
first launch when the plan's builds lack the RDMA transport (:func:`moetune.run.launch.check_transport`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moetune.errors import InputError
from moetune.hardware.inventory import Inventory
from moetune.kinds import Transport


def check_transport_axis(transports: Sequence[str], hw: Inventory) -> None:
    """Refuse transports the hardware file does not offer: any choice needs an RPC node, RDMA (or
    a choice between transports) needs ``rdma: true`` on every RPC node."""
    bad = [t for t in transports if t not in tuple(Transport)]
    if bad:
        raise InputError(f"--try-transport {','.join(bad)}: choose {', '.join(Transport)}")
    if tuple(transports) == (Transport.TCP,):
        return
    what = f"--try-transport {','.join(transports)}" if len(transports) > 1 else f"--transport {transports[0]}"
    nodes = [n for n in hw.nodes[1:] if n.devices]
    if not nodes:
        raise InputError(
            f"{what}: the hardware file has no RPC node, so the server talks to no worker and "
            "has no transport to choose",
            hint="drop the option",
        )
    if len(transports) > 1 or Transport.RDMA in transports:
        lacking = [n.name for n in nodes if not n.rdma]
        if lacking:
            raise InputError(
                f"{what}: the hardware file does not say that the link to node {', '.join(lacking)} "
                "carries RDMA, so TCP is the only transport there",
                hint="once `ibv_devices` lists the RoCE device on both ends, set `rdma: true` on the "
                "node in the hardware file; else drop the option",
            )


def refuse_unbuilt(docs: Sequence[dict[str, Any]], transports: Sequence[str], rdma_dev: str | None) -> None:
    """Before the first launch: RDMA where the builds of a plan (these candidates' documents) lack it."""
    if Transport.RDMA not in transports or not docs:
        return
    from moetune.engine.launchspec import LaunchSpec
    from moetune.run.launch import check_transport

    check_transport(LaunchSpec.from_json(docs[0]["launch"]), Transport.RDMA, rdma_dev)
