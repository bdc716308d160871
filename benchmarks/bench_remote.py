"""Plan before download: the 8-shard GLM-5.1 replica (IQ3_KS, sparse) served over the loopback with
HTTP Range (tests/gguf_http.py), read by `moetune plan URL` and `moetune inspect URL`.

Records the bytes and requests fetched (goal: under 1% of ONE shard's size, for all eight
headers) and the seconds (goal: under 2 s for the plan), in-process and as whole commands
(interpreter start included), beside the same commands on the local files.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moetune.model.archs import PRESET_RECIPES, PRESETS
from moetune.model.profile import load_profile
from moetune.model.testmodel import generate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests/gguf_http.py
from tests.gguf_http import Hub, serve

RUNS = 5


def _timed(argv: list[str]) -> tuple[float, dict[str, object]]:
    t0 = time.perf_counter()
    r = subprocess.run(argv, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, json.loads(r.stdout)


def main(results: Path) -> None:
    moetune = [sys.executable, "-m", "moetune"]
    arch, dims = PRESETS["glm-5.1"]
    with tempfile.TemporaryDirectory() as d:
        g = generate(Path(d) / "GLM-5.1-IQ3_KS.gguf", arch, dims, PRESET_RECIPES["glm-5.1"], shards=8, sparse=True)
        shard_bytes = g.files[0].stat().st_size
        model_bytes = sum(f.stat().st_size for f in g.files)
        with serve(Hub(Path(d))) as hub:
            url = hub.file_url(g.files[0].name)
            load_s = []
            for _ in range(RUNS):
                t0 = time.perf_counter()
                p = load_profile(url)
                load_s.append(time.perf_counter() - t0)
            assert p.remote is not None
            plan = [*moetune, "plan", url, "--hw", "rtx-pro-6000", "--json"]
            inspect = [*moetune, "inspect", url, "--json"]
            plan_runs = [_timed(plan) for _ in range(RUNS)]
            inspect_runs = [_timed(inspect) for _ in range(RUNS)]
        local_plan = [
            _timed([*moetune, "plan", str(g.files[0]), "--hw", "rtx-pro-6000", "--json"])[0] for _ in range(RUNS)
        ]
    fetched = p.remote.bytes_fetched
    res = {
        "what": "the 8-shard GLM-5.1 IQ3_KS replica over loopback HTTP with Range: headers only",
        "command": "moetune plan http://127.0.0.1:PORT/files/GLM-5.1-IQ3_KS-00001-of-00008.gguf --hw rtx-pro-6000 --json",
        "shard_bytes": shard_bytes,
        "model_bytes": model_bytes,
        "bytes_fetched": fetched,
        "requests": p.remote.requests,
        "fetched_pct_of_one_shard": round(100 * fetched / shard_bytes, 4),
        "goal_pct_of_one_shard": 1.0,
        "load_profile_s": load_s,
        "load_profile_median_s": statistics.median(load_s),
        "plan_command_s": [t for t, _ in plan_runs],
        "plan_command_median_s": statistics.median(t for t, _ in plan_runs),
        "plan_local_command_median_s": statistics.median(local_plan),
        "inspect_command_median_s": statistics.median(t for t, _ in inspect_runs),
        "goal_s": 2.0,
        "plan_fits": plan_runs[-1][1]["fits"],
    }
    (results / "remote.json").write_text(json.dumps(res, indent=2) + "\n")
    print(
        f"remote: fetched {fetched / 1024:,.0f} KiB in {res['requests']} requests "
        f"({res['fetched_pct_of_one_shard']:.3f}% of one shard, goal < 1%); plan command median "
        f"{res['plan_command_median_s']:.2f} s (local {res['plan_local_command_median_s']:.2f} s), "
        f"in-process read {res['load_profile_median_s']:.2f} s, goal < 2 s"
    )
