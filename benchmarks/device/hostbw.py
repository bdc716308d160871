"""Bandwidths the speed model takes as inputs, measured in a few seconds: host RAM (numpy one
thread; torch with all threads: copy and read-only sum), host<->device copies (pinned and
pageable) and device memory (device-to-device copy). Prints one JSON object; every figure is
GB/s (1e9 bytes per second), the best of a few repeats, bytes counted once per direction
(a copy of N bytes counts N, not 2N; the `_rw` fields count read plus write).
"""

from __future__ import annotations

import json
import os
import sys
import time


def best(fn, reps: int = 4) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return min(ts)


def main() -> int:
    size = int(float(os.environ.get("HOSTBW_GIB", "2")) * 2**30)
    out: dict[str, object] = {"bytes": size}
    import numpy as np

    a = np.ones(size, dtype=np.uint8)
    b = np.empty_like(a)
    t = best(lambda: np.copyto(b, a))
    out["ram_numpy_copy_1thread_gbs"] = round(size / t / 1e9, 2)
    out["ram_numpy_copy_1thread_rw_gbs"] = round(2 * size / t / 1e9, 2)
    try:
        import torch
    except ImportError:
        print(json.dumps(out))
        return 0
    nthr = os.cpu_count() or 1
    torch.set_num_threads(nthr)
    out["torch_threads"] = nthr
    x = torch.ones(size // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    t = best(lambda: y.copy_(x))
    out["ram_torch_copy_gbs"] = round(size / t / 1e9, 2)
    out["ram_torch_copy_rw_gbs"] = round(2 * size / t / 1e9, 2)
    t = best(lambda: float(x.sum()))
    out["ram_torch_sum_read_gbs"] = round(size / t / 1e9, 2)
    if not torch.cuda.is_available():
        print(json.dumps(out))
        return 0
    dev = torch.device("cuda")
    out["gpu"] = torch.cuda.get_device_name(0)
    free, total = torch.cuda.mem_get_info()
    out["gpu_mem_free_mib"], out["gpu_mem_total_mib"] = free // 2**20, total // 2**20
    g = torch.empty(size // 4, dtype=torch.float32, device=dev)
    g2 = torch.empty_like(g)

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(4):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e) / 1e3)
        return min(ts)

    t0 = time.perf_counter()
    p = torch.ones(size // 4, dtype=torch.float32).pin_memory()
    out["pin_2gib_alloc_s"] = round(time.perf_counter() - t0, 3)
    out["h2d_pinned_gbs"] = round(size / timed(lambda: g.copy_(p, non_blocking=True)) / 1e9, 2)
    out["d2h_pinned_gbs"] = round(size / timed(lambda: p.copy_(g, non_blocking=True)) / 1e9, 2)
    out["h2d_pageable_gbs"] = round(size / timed(lambda: g.copy_(x)) / 1e9, 2)
    out["d2h_pageable_gbs"] = round(size / timed(lambda: x.copy_(g)) / 1e9, 2)
    out["d2d_copy_gbs"] = round(size / timed(lambda: g2.copy_(g)) / 1e9, 2)
    out["d2d_copy_rw_gbs"] = round(2 * size / timed(lambda: g2.copy_(g)) / 1e9, 2)
    out["gpu_sum_read_gbs"] = round(size / timed(lambda: g.sum()) / 1e9, 2)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
