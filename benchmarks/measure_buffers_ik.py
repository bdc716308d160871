"""Calibration grid for ik_llama.cpp's compute buffers (the ik branch of src/moetune/plan/compute.py).

Starts the ik llama-server that `moetune engine install --kind ik_llama.cpp` builds on generated
models of every family at two widths, over ubatch, context, flash attention, cache type, -amb and
placements (layers on a loopback ik rpc-server, experts there or on the CPU, CPU only), stops it
once the buffers are reserved, and writes every logged buffer to a JSON file. Run by hand when the
engine version changes: ``python benchmarks/measure_buffers_ik.py OUT.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from moetune.engine import registry
from moetune.engine.logs import parse_log
from moetune.kinds import EngineKind
from moetune.run.verify import IK_RESERVED

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from benchmarks.measure_buffers import calibration_models
from tests.engine_harness import reserve_log, rpc_workers

# (ubatch, ctx, flash attention, cache type, -amb, placement)
GRID = [
    g
    for g in itertools.product(
        (64, 256, 1024), (512, 4096, 16384), ("on", "off"), ("f16", "q8_0"), (0, 16), ("rpc", "rpc-exps-cpu", "cpu")
    )
    if not (g[4] and g[2] == "on") and not (g[3] == "q8_0" and g[2] == "off")
]  # -amb acts without FA


def main(out: Path) -> None:
    ik = registry.builtin(EngineKind.IK)
    server = ik.binary("server")
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, wide, model in calibration_models(Path(tmp)):
            with rpc_workers(server.parent, 1, binary="rpc-server") as (rpc,):
                for ub, ctx, fa, ct, amb, pl in GRID:
                    args = [
                        "-m",
                        str(model),
                        "-c",
                        str(ctx),
                        "-ub",
                        str(ub),
                        "-b",
                        str(max(ub, 512)),
                        "--parallel",
                        "1",
                        "-fa",
                        fa,
                        "-ctk",
                        ct,
                        "-ctv",
                        ct,
                        "--jinja",
                    ]
                    args += ["-amb", str(amb)] if amb else []
                    args += ["-mla", "3"] if arch in ("deepseek2", "glm-dsa") else []
                    # a CPU-only build counts the CPU as device 0: -ts 0,1 puts the layers on the RPC device
                    args += ["--rpc", rpc, "-ngl", "999", "-ts", "0,1"] if pl != "cpu" else []
                    args += ["-ot", "exps=CPU"] if pl == "rpc-exps-cpu" else []
                    ok, log = reserve_log(server, args, marker=IK_RESERVED)
                    bufs = {d: asdict(b) for d, b in parse_log(log).device_buffers().items()} if ok else {}
                    points.append(
                        {
                            "arch": arch,
                            "wide": wide,
                            "ub": ub,
                            "ctx": ctx,
                            "fa": fa,
                            "ct": ct,
                            "amb": amb,
                            "placement": pl,
                            "slots": 1,
                            "ok": ok,
                            "buffers": bufs,
                        }
                    )
            print(arch, wide, sum(p["ok"] for p in points), len(points), flush=True)
    out.write_text(json.dumps(points))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("buffers-ik.json"))
