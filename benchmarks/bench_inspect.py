"""Time `moetune inspect` on the 8-shard sparse GLM-5.1-sized replica (goal: under 1 s)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RECIPE = "ffn_gate_exps=iq3_ks,ffn_up_exps=iq3_ks,ffn_down_exps=iq4_ks,other=q8_0"


def main(results: Path) -> None:
    moetune = [sys.executable, "-m", "moetune"]
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "GLM-5.1-IQ3_KS.gguf"
        subprocess.run(
            [
                *moetune,
                "testmodel",
                str(out),
                "--preset",
                "glm-5.1",
                "--type",
                RECIPE,
                "--shards",
                "8",
                "--sparse",
                "--json",
            ],
            check=True,
            capture_output=True,
        )
        shard = Path(d) / "GLM-5.1-IQ3_KS-00004-of-00008.gguf"
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            r = subprocess.run([*moetune, "inspect", str(shard), "--json"], check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        doc = json.loads(r.stdout)
        # the in-process parse alone, without interpreter start-up
        from moetune.model.profile import load_profile

        t0 = time.perf_counter()
        load_profile(shard)
        parse_s = time.perf_counter() - t0
    res = {
        "what": "moetune inspect --json on the sparse 8-shard GLM-5.1 replica (whole command, 5 runs)",
        "command": f"moetune inspect {shard.name} --json",
        "seconds": times,
        "median_s": statistics.median(times),
        "parse_only_s": parse_s,
        "goal_s": 1.0,
        "moe_layers": sum(1 for layer in doc["layers"] if layer["kind"] == "moe"),
        "total_bytes": doc["total_bytes"],
    }
    (results / "inspect.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"inspect: median {res['median_s']:.3f} s (parse only {parse_s:.3f} s), goal < 1 s")
