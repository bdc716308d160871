"""Calibration grid for the compute-buffer model (src/moetune/plan/compute.py).

Starts llama-server on generated models of every family at two widths over ubatch, context,
slots, flash attention and placements (all on a loopback RPC device, experts on the CPU, CPU
only), stops it once the buffers are reserved, and writes every logged buffer to a JSON file.
Run by hand when the engine version changes: ``python benchmarks/measure_buffers.py OUT.json``.
"""

from __future__ import annotations

import itertools
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

from moetune.engine import registry
from moetune.engine.logs import parse_log
from moetune.model.archs import ARCHS, small_dims
from moetune.model.testmodel import generate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/engine_harness.py
from tests.engine_harness import reserve_log, rpc_workers


def calibration_models(tmp: Path) -> Iterator[tuple[str, bool, Path]]:
    """(arch, wide, file) for every family at two widths; the wide ones also get a larger
    vocabulary (the output buffers). The ik grid (measure_buffers_ik.py) uses the same models."""
    for arch in ARCHS:
        for wide in (False, True):
            dims = replace(small_dims(arch, True), n_vocab=2048) if wide else small_dims(arch)
            yield arch, wide, generate(tmp / f"{arch}-{int(wide)}.gguf", arch, dims, "f16").files[0]


def main(out: Path) -> None:
    server = registry.get().binary("server")
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        for arch, wide, model in calibration_models(Path(tmp)):
            with rpc_workers(server.parent, 1) as (rpc,):
                for ub, ctx, fa, pl, par in itertools.product(
                    (32, 128, 512, 1024), (512, 4096, 16384), ("on", "off"), ("rpc", "rpc-exps-cpu", "cpu"), (1, 4)
                ):
                    # -nr: CPU weight repacking crashes on some CPUs (DESIGN.md section 5)
                    args = [
                        "-m",
                        str(model),
                        "-nr",
                        "-lv",
                        "4",
                        "-c",
                        str(ctx),
                        "-ub",
                        str(ub),
                        "-b",
                        str(max(ub, 512)),
                        "--parallel",
                        str(par),
                        "-fit",
                        "off",
                        "-fa",
                        fa,
                    ]
                    args += ["--rpc", rpc] if pl != "cpu" else []
                    args += ["-ot", "exps=CPU"] if pl == "rpc-exps-cpu" else []
                    ok, log = reserve_log(server, args)
                    bufs = {d: asdict(b) for d, b in parse_log(log).device_buffers().items()} if ok else {}
                    points.append(
                        {
                            "arch": arch,
                            "wide": wide,
                            "ub": ub,
                            "ctx": ctx,
                            "fa": fa,
                            "placement": pl,
                            "slots": par,
                            "ok": ok,
                            "buffers": bufs,
                        }
                    )
            print(arch, wide, sum(p["ok"] for p in points), len(points), flush=True)
    out.write_text(json.dumps(points))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("buffers.json"))
