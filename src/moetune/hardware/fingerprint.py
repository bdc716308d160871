"""A short id of the machine a result was measured on (CPU model, cores, RAM, GPUs)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
from pathlib import Path


def machine_facts() -> dict[str, str]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_kib = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_kib = line.split()[1]
                break
    except OSError:
        pass
    gpus = ""
    if shutil.which("nvidia-smi"):
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            gpus = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
    return {
        "machine": platform.machine(),
        "cpu": cpu,
        "cores": str(os.cpu_count() or 0),
        "ram_kib": ram_kib,
        "gpus": gpus,
        "hostname": platform.node(),
    }


def fingerprint(facts: dict[str, str] | None = None) -> str:
    f = facts or machine_facts()
    key = "|".join(f[k] for k in ("machine", "cpu", "cores", "ram_kib", "gpus"))
    return hashlib.sha256(key.encode()).hexdigest()[:16]
