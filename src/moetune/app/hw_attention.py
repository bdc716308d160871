"""`moetune hw attention FILE`: measure this CPU's attention kernels with llama-bench and fit the
speed model's eight attention constants (stored in the hardware file's ``cpu.speed`` where asked)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from moetune.errors import InputError
from moetune.kinds import EngineKind

if TYPE_CHECKING:
    from moetune.hardware.inventory import Inventory, Node
    from moetune.tune.cpu_attention import Fitted

Warn = Callable[[str, str], None]  # (message, remedy)


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionRequest:
    path: Path  # the hardware file
    node: str | None = None  # the node whose CPU this machine is (default: the first)
    engine: str | None = None  # the llama.cpp build whose kernels to measure (default: the built-in)
    threads: int | None = None  # default: the node's cores
    model: Path | None = None  # a GGUF to measure on (default: a generated MoE model)
    depth: int = 2048
    repeats: int = 2  # samples a launch
    rounds: int = 3  # launches of each variant, interleaved
    write: bool = False  # store the constants in the file's cpu.speed


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    node: Node
    threads: int
    fitted: Fitted
    written: bool

    def to_json(self) -> dict[str, object]:
        return {**self.fitted.to_json(), "node": self.node.name, "written": self.written}


def measure(
    req: AttentionRequest, *, warn: Warn | None = None, progress: Callable[[str], None] | None = None
) -> Measured:
    """Measure and fit (``warn``: a busy machine, said before measuring; ``progress``: llama-bench's
    lines); rewrite the hardware file with the constants where ``req.write``."""
    import tempfile

    import yaml

    from moetune.engine import registry
    from moetune.hardware import inventory
    from moetune.model.profile import load_profile
    from moetune.tune import cpu_attention as attention
    from moetune.tune.quiet import foreign_load

    inv = inventory.load(req.path)
    node = next((n for n in inv.nodes if n.name == req.node), None) if req.node else inv.local
    if node is None:
        raise InputError(
            f"--node {req.node}: no such node in {req.path}", hint="nodes: " + ", ".join(n.name for n in inv.nodes)
        )
    name, kind = registry.resolve(req.engine)
    if kind != EngineKind.MAINLINE:
        raise InputError(
            f"--engine {name}: ik_llama.cpp's llama-bench has no --n-depth",
            hint="measure with a mainline build (the built-in one); the constants are the CPU's",
        )
    binary = registry.get(name).binary("bench")
    t = min(req.threads or node.cores, node.cores)
    busy = foreign_load()
    if busy is not None and busy.contended and warn is not None:
        warn(
            f"the machine is busy: {busy.message()}; the constants will measure that load too",
            "stop the programs named and run it again (MOETUNE_MAX_FOREIGN_CORES sets the threshold)",
        )
    with tempfile.TemporaryDirectory(prefix="moetune-attention-") as tmp:
        gguf = req.model or attention.probe_model(Path(tmp))
        rows = attention.measure(
            binary, gguf, threads=t, depth=req.depth, repeats=req.repeats, rounds=req.rounds, progress=progress
        )
        fitted = attention.fit_attention(load_profile(gguf), node, t, rows)
    if req.write:
        req.path.write_text(yaml.safe_dump(inventory.to_dict(_with_speed(inv, node, fitted)), sort_keys=False))
    return Measured(node=node, threads=t, fitted=fitted, written=req.write)


def _with_speed(inv: Inventory, node: Node, fitted: Fitted) -> Inventory:
    nodes = tuple(replace(n, cpu_speed=tuple(sorted(fitted.constants.items()))) if n is node else n for n in inv.nodes)
    return replace(inv, nodes=nodes)
