"""Probe this machine: GPUs through nvidia-smi (NVML), RAM from /proc/meminfo, cores from lscpu,
RAM bandwidth measured with a large copy (or estimated when --no-measure)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from moetune.hardware.inventory import DEFAULT_PCIE_GBS, Device, Inventory, Node
from moetune.kinds import DeviceKind

# Memory bandwidth (GB/s) by GPU name, for what NVML does not report.
GPU_BANDWIDTH = {
    "H200": 4800, "H100 NVL": 3900, "H100": 3350, "A100": 2039, "L40S": 864, "RTX PRO 6000": 1790,
    "RTX 6000 Ada": 960, "RTX 5090": 1792, "RTX 4090": 1008, "RTX 3090": 936, "GB10": 273, "A6000": 768,
}


def _cores() -> int:
    try:
        out = subprocess.run(["lscpu", "-p=CORE"], capture_output=True, text=True, timeout=10).stdout
        cores = {line for line in out.splitlines() if line and not line.startswith("#")}
        if cores:
            return len(cores)
    except (OSError, subprocess.TimeoutExpired):
        pass
    return os.cpu_count() or 1


def _ram_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure_ram_bw_gbs(size_mib: int = 256, repeats: int = 3) -> float:
    """Copy bandwidth of one large buffer (read + write counted), best of a few runs."""
    import numpy as np

    src = np.ones(size_mib << 18, dtype=np.float32)
    dst = np.empty_like(src)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        dt = time.perf_counter() - t0
        best = max(best, 2 * src.nbytes / dt / 1e9)
    return round(best, 1)


def _gpus() -> list[Device]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,pcie.link.gen.max,pcie.link.width.max",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    devs = []
    for line in out.strip().splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) < 3:
            continue
        idx, name, mem = parts[0], parts[1], float(parts[2])
        bw = next((v for k, v in GPU_BANDWIDTH.items() if k in name), 500)
        link = DEFAULT_PCIE_GBS
        if len(parts) >= 5 and re.fullmatch(r"\d+", parts[3]) and re.fullmatch(r"\d+", parts[4]):
            link = round({3: 0.985, 4: 1.969, 5: 3.938}.get(int(parts[3]), 1.969) * int(parts[4]) * 0.8, 1)
        devs.append(Device(f"CUDA{idx}", DeviceKind.GPU, mem, float(bw), "local", link))
    return devs


def probe(measure: bool = True) -> Inventory:
    ram = _ram_mib()
    bw = measure_ram_bw_gbs() if measure else 20.0 * _cores()
    node = Node("local", _cores(), round(ram), bw, tuple(_gpus()))
    return Inventory((node,), name=os.uname().nodename)
